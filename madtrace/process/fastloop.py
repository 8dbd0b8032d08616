# SPDX-License-Identifier: GPL-2.0-or-later
"""The data engine's hot loop in C (madtrace/process/fault_loop.c), through ctypes.

``FaultLoop`` owns the C context: the pages madtrace protected, the traced
byte ranges, the registered instructions (with their stub and the operand's
addressing), the threads (their data slot and call-record counter) and a
numpy buffer of access records (``FAST_RECORD_DTYPE``) that the engine drains.
``wait(block)`` replaces ``waitpid(-1)`` while data tracing is on: it handles
every fault of a registered instruction in one ptrace stop and returns the
first stop it cannot handle as ``(tid, status)``.
``handle_fault(tid, address)`` handles one already-reported fault the same
way (the first fault of an instruction, right after it was registered).
``flush()`` writes back the stores of every slot whose stub ran; it runs at
every stop the loop sees, and the Python side calls it at every stop it sees.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os

import numpy as np

from ..errors import TracerInternalError
from ..native import load
from . import ptrace_raw as pr


FAST_RECORD_DTYPE = np.dtype([("seq", "<u8"), ("order", "<u8"), ("rip", "<u8"), ("addr", "<u8"),
                              ("tid", "<u4"), ("size", "<u2"), ("kind", "u1"), ("ilen", "u1"),
                              ("first", "u1"), ("pad", "u1", 7)])
RECORD_CAPACITY = 1 << 16
REG_NONE, REG_RIP = 0xFF, 0xFE
# how an instruction's access is carried out (fault_loop.c OP_*)
OP_REDIRECT, OP_JMP, OP_CALL, OP_MOVS, OP_STOS = range(5)
ANY_SLOT = 0xFFFFFFFF
# index of each register in struct user_regs_struct (8-byte words)
USER_REG_INDEX = {name: i for i, name in enumerate(
    ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx",
     "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base"))}
SEGMENTS = {None: 0, "fs": 1, "gs": 2}


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = load("libmtloop.so", "the data engine's hot loop", use_errno=True)
    P, U64, I, SZ = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "mt_new": (P, [I, P, U64, SZ, P, SZ]), "mt_free": (None, [P]),
        "mt_record_size": (SZ, []),
        "mt_set_protected": (I, [P, P, SZ]), "mt_set_traced": (I, [P, P, SZ]),
        "mt_set_safe_syscalls": (I, [P, P, SZ]), "mt_set_resume": (None, [P, I]),
        "mt_set_kinds": (None, [P, U64]), "mt_set_alias": (None, [P, P, U64]),
        "mt_order": (U64, [P]), "mt_set_order": (None, [P, U64]),
        "mt_n_records": (SZ, [P]), "mt_clear_records": (None, [P]), "mt_n_insns": (SZ, [P]),
        "mt_insn_resize": (I, [P, SZ]), "mt_insn_ask": (None, [P, U64, I]),
        "mt_insn_move": (I, [P, U64, U64, I, I]),
        "mt_stats": (None, [P, P]),
        "mt_thread_set": (I, [P, I, I, P]), "mt_thread_del": (None, [P, I]),
        "mt_thread_recording": (None, [P, I, I]),
        "mt_insn_add": (I, [P, U64, ctypes.c_uint32, U64, I, I, I, ctypes.c_int64, I, I, I, I,
                            I, I, I, I, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, U64]),
        "mt_set_ring_mode": (None, [P, I]), "mt_ring_full": (U64, [P]),
        "mt_set_epoch": (None, [P, P]),
        "mt_flush": (I, [P]), "mt_handle_fault": (I, [P, I, U64]),
        "mt_wait": (I, [P, I, ctypes.POINTER(I), ctypes.POINTER(I)]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    if lib.mt_record_size() != FAST_RECORD_DTYPE.itemsize:
        raise TracerInternalError("libmtloop.so does not match FAST_RECORD_DTYPE: rebuild it")
    return lib


def _runs_array(runs) -> np.ndarray:
    return np.ascontiguousarray(np.array(sorted(runs), dtype=np.uint64).reshape(-1, 2))


class FaultLoop:
    def __init__(self, pid: int, area_local, area_address: int):
        """``area_local``: the tracer's writable mapping of the data area (an mmap)."""
        self.lib = _library()
        self._fd = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
        self._area = (ctypes.c_char * len(area_local)).from_buffer(area_local)
        self.records = np.zeros(RECORD_CAPACITY, dtype=FAST_RECORD_DTYPE)
        self._insn_cap = 1 << 12
        self._ctx = self.lib.mt_new(self._fd, ctypes.addressof(self._area), area_address,
                                    self._insn_cap, self.records.ctypes.data, RECORD_CAPACITY)
        if not self._ctx:
            raise MemoryError("mt_new")
        self._tid = ctypes.c_int()
        self._status = ctypes.c_int()

    @property
    def ctx(self) -> int:
        if not self._ctx:   # never hand C a freed context
            raise TracerInternalError("the data engine's loop was used after it was closed")
        return self._ctx

    @property
    def closed(self) -> bool:
        return not self._ctx

    def close(self) -> None:
        """Frees the C context; the loop must not be used afterwards (``closed``)."""
        if self._ctx:
            self.lib.mt_free(self._ctx)
            self._ctx = None
        del self._area
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # ------------------------------------------------------------- tables
    def set_protected(self, runs) -> None:
        """``runs``: (start, end, original PROT_* bits) of the protected pages."""
        arr = np.ascontiguousarray(np.array(sorted(runs), dtype=np.uint64).reshape(-1, 3))
        self.lib.mt_set_protected(self.ctx, arr.ctypes.data, len(arr))

    def set_traced(self, runs) -> None:
        arr = _runs_array(runs)
        self.lib.mt_set_traced(self.ctx, arr.ctypes.data, len(arr))

    def set_safe_syscalls(self, numbers) -> None:
        bitmap = np.zeros(64, dtype=np.uint8)
        for nr in numbers:
            bitmap[nr // 8] |= 1 << (nr % 8)
        self.lib.mt_set_safe_syscalls(self.ctx, bitmap.ctypes.data, len(bitmap))

    def set_resume(self, trace_syscalls: bool) -> None:
        self.lib.mt_set_resume(self.ctx, pr.PTRACE_SYSCALL if trace_syscalls else pr.PTRACE_CONT)

    def set_alias(self, bits_address: int, alias_bit: int) -> None:
        """Stores into aliased pages are written through their alias (``bits_address``:
        the tracer's mapping of the alias bitmap, alias.py)."""
        self.lib.mt_set_alias(self.ctx, bits_address or None, alias_bit)

    def set_ring_mode(self, on: bool) -> None:
        """Records go into each thread's ring, as data records with instruction ids
        (hybrid engine), instead of the loop's own buffer."""
        self.lib.mt_set_ring_mode(self.ctx, int(on))

    def set_epoch(self, address: int) -> None:
        """Ring mode: where the control block's epoch is in the tracer (every data
        record carries its value: ring_split.py)."""
        self.lib.mt_set_epoch(self.ctx, address or None)

    def ring_full(self) -> int:
        return self.lib.mt_ring_full(self.ctx)

    def set_kinds(self, loads: bool, stores: bool) -> None:
        self.lib.mt_set_kinds(self.ctx, (1 if loads else 0) | (2 if stores else 0))

    @property
    def order(self) -> int:
        return self.lib.mt_order(self.ctx)

    @order.setter
    def order(self, value: int) -> None:
        self.lib.mt_set_order(self.ctx, value)

    def set_thread(self, tid: int, slot: int, head_address: int) -> None:
        """``head_address``: where the thread's call-record count is in the
        tracer's memory (0: none)."""
        if self.lib.mt_thread_set(self.ctx, tid, slot, head_address or None) < 0:
            raise TracerInternalError("too many threads for the data engine's hot loop")

    def set_recording(self, tid: int, on: bool) -> None:
        """Whether the thread's accesses are recorded (they are always carried out)."""
        self.lib.mt_thread_recording(self.ctx, tid, int(on))

    def remove_thread(self, tid: int) -> None:
        self.lib.mt_thread_del(self.ctx, tid)

    def add_instruction(self, rip: int, slot: int, stub: int, base: str | None, index: str | None,
                        scale: int, disp: int, segment: str | None, size: int, load: bool,
                        store: bool, ilen: int, addr32: bool, atomic: bool,
                        op: int = OP_REDIRECT, rep: bool = False, ids=(0, 0, 0),
                        alias_stub: int = 0) -> None:
        """``slot`` ANY_SLOT: the instruction is carried out here for every thread
        (``op`` other than OP_REDIRECT, no stub); ``ids``: its instruction ids in
        ring mode (instruction_table.py); ``alias_stub``: the stub that carries
        the access out on the operand's alias (datastubs.py), taken when every
        page of the operand is aliased (0: none; then such an access is handed
        back)."""
        entry = (rip, slot, stub,
                 REG_RIP if base == "rip" else USER_REG_INDEX[base] if base else REG_NONE,
                 USER_REG_INDEX[index] if index else REG_NONE, scale or 1, disp,
                 SEGMENTS[segment], size, (1 if load else 0) | (2 if store else 0), ilen,
                 int(addr32), int(atomic), op, int(rep), *ids, alias_stub)
        if self.lib.mt_insn_add(self.ctx, *entry) < 0:
            # the table is half full: twice as large, rehashed, then add again
            self._insn_cap *= 2
            if self.lib.mt_insn_resize(self.ctx, self._insn_cap) < 0:
                raise MemoryError("mt_insn_resize")
            if self.lib.mt_insn_add(self.ctx, *entry) < 0:
                raise TracerInternalError("cannot add to the instruction table")

    def move_to(self, rip: int, to: int, load: bool, store: bool, ask: int = 0) -> None:
        """A fault of the instruction at ``rip`` moves the thread to ``to`` (its
        copy's probe, rewriting.py) in the loop, without Python, but every
        (``ask`` + 1)-th (``ask`` 2^k - 1; 0: none); ``to`` 0: such faults come
        to Python again."""
        kinds = (1 if load else 0) | (2 if store else 0)
        if self.lib.mt_insn_move(self.ctx, rip, to, kinds, ask) < 0:
            self._insn_cap *= 2
            if self.lib.mt_insn_resize(self.ctx, self._insn_cap) < 0:
                raise MemoryError("mt_insn_resize")
            if self.lib.mt_insn_move(self.ctx, rip, to, kinds, ask) < 0:
                raise TracerInternalError("cannot add to the instruction table")

    def ask_again(self, rip: int, mask: int) -> None:
        """Every (mask + 1)-th fault of the instruction the loop meets comes to
        Python again (``wait``); mask 0: none."""
        self.lib.mt_insn_ask(self.ctx, rip, mask)

    # ------------------------------------------------------------- running
    def wait(self, block: bool) -> tuple[int, int] | None:
        """(tid, status) of the next stop the loop does not handle, or None when
        nothing happened (block=False) or the record buffer must be drained."""
        while True:
            r = self.lib.mt_wait(self.ctx, int(block), ctypes.byref(self._tid),
                                 ctypes.byref(self._status))
            if r == 1:
                return self._tid.value, self._status.value
            if r in (0, 2):
                return None
            err = ctypes.get_errno()
            if err == errno.EINTR:
                return None        # a signal of the tracer (Ctrl-C, a timer): let Python run
            raise ChildProcessError(err, os.strerror(err))

    def handle_fault(self, tid: int, address: int) -> bool:
        return bool(self.lib.mt_handle_fault(self.ctx, tid, address))

    def flush(self) -> int:
        return self.lib.mt_flush(self.ctx)

    def take_records(self) -> np.ndarray:
        n = self.lib.mt_n_records(self.ctx)
        out = self.records[:n].copy()
        self.lib.mt_clear_records(self.ctx)
        return out

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * 6)()
        self.lib.mt_stats(self.ctx, out)
        return dict(zip(("fast", "untraced", "syscalls", "writebacks", "writeback_errors", "moves"),
                        out))
