# SPDX-License-Identifier: GPL-2.0-or-later
"""Learn of dlopen/dlclose as they happen, without leaving a trap behind.

The dynamic loader calls ``_dl_debug_state`` (an empty function: ``ret``, or
``endbr64; ret``) each time its list of modules is about to change and once it
is consistent again, with the state in ``_r_debug.r_state`` (RT_CONSISTENT 0,
RT_ADD 1, RT_DELETE 2); debuggers put a breakpoint there (gdb's "pending
breakpoints").  A plain int3 would kill the program at its next dlopen if
madtrace were killed meanwhile, so the function is patched with a jmp to a
stub that traps only while the tracer lives:

    push rax, rdi, rsi, rdx, r10, rcx, r11
    pidfd_send_signal(<pidfd of the tracer>, 0, NULL, 0)   # 0: the tracer is alive
    test rax, rax;  pop r11, rcx, r10, rdx, rsi, rdi, rax   # pops keep the flags
    jne 1f;  int3                                           # the tracer's stop
 1: ret

The pidfd (opened in the target by a remote pidfd_open of the tracer's pid)
names that very process: once it is gone the call fails with ESRCH and the
stub is a plain ``ret``; if the program closed the descriptor, EBADF: the
same.  At its trap the tracer reads ``r_state`` and, when the list is
consistent, calls ``on_change(tid)`` with the trapping thread stopped (the
loader holds its lock while it calls: no other thread is loading meanwhile).
``remove`` puts the original bytes back and closes the descriptor; the
stub's area is unmapped with madtrace's other areas (mappings.py).
"""

from __future__ import annotations

import os
import signal
import struct
from typing import Callable

from ..arch.x86_64.encode import jmp_rel32
from ..binary.address_space import AddressSpace
from ..errors import UnknownSymbolError
from ..process.events import SignalStop
from ..process.remote_syscall import RemoteSyscalls
from ..process.tracee import Tracee
from .areas import SharedArea, gap_for_module
from .patchset import Patch, PatchSet

SYS_PIDFD_OPEN, SYS_PIDFD_SEND_SIGNAL = 434, 424
RT_CONSISTENT = 0
R_STATE_OFFSET = 24          # struct r_debug: r_version, r_map, r_brk, r_state
ENDBR64 = bytes.fromhex("f30f1efa")
RET = b"\xc3"


def stub_code(stub: int, fd_slot: int) -> tuple[bytes, int]:
    """The stub at ``stub`` reading the pidfd at ``fd_slot``; returns (code, offset
    of its int3)."""
    code = bytearray()
    code += bytes([0x50, 0x57, 0x56, 0x52, 0x41, 0x52, 0x51, 0x41, 0x53])  # push rax rdi rsi rdx r10 rcx r11
    code += b"\xb8" + struct.pack("<I", SYS_PIDFD_SEND_SIGNAL)               # mov eax, 424
    rel = fd_slot - (stub + len(code) + 6)
    code += b"\x8b\x3d" + struct.pack("<i", rel)                              # mov edi, [rip+fd]
    code += bytes.fromhex("31f6" "31d2" "4531d2")                             # xor esi,esi; edx; r10d
    code += bytes.fromhex("0f05" "4885c0")                                    # syscall; test rax,rax
    code += bytes([0x41, 0x5B, 0x59, 0x41, 0x5A, 0x5A, 0x5E, 0x5F, 0x58])  # pop r11 rcx r10 rdx rsi rdi rax
    code += bytes.fromhex("7501")                                             # jne +1
    trap = len(code)
    code += b"\xcc" + RET
    return bytes(code), trap


class LoaderWatch:
    def __init__(self, tracee: Tracee, space: AddressSpace, on_change: Callable[[int], None]):
        self.tracee = tracee
        self.on_change = on_change
        self.patches = PatchSet()
        self.area: SharedArea | None = None
        self.trap = 0
        self.pidfd = -1
        self.changes = 0
        self.reason = ""          # why the watch could not be set (empty: it is set)
        try:
            self.function = space.find_symbol("ld-linux-x86-64.so.2:_dl_debug_state")
            self.r_debug = space.find_symbol("ld-linux-x86-64.so.2:_r_debug").address
        except UnknownSymbolError:
            self.function = None
            self.reason = "the dynamic loader has no _dl_debug_state/_r_debug symbols"

    def install(self) -> bool:
        """Every thread stopped.  False (and ``reason``) when the loader's function is
        not the empty one this stub replaces."""
        if self.function is None:
            return False
        tracee, at = self.tracee, self.function.address
        head = tracee.mem.read(at, 5)
        if not (head[:1] == RET or head == ENDBR64 + RET):
            self.reason = f"_dl_debug_state is not an empty function ({head.hex()})"
            return False
        module = self.function.module
        with RemoteSyscalls(tracee) as rs:
            where = gap_for_module(tracee.pid, module.start, module.end, 4096)
            self.area = SharedArea(rs, 4096, "madtrace-loader-watch", executable=True, address=where)
            self.pidfd = rs.call(SYS_PIDFD_OPEN, os.getpid(), 0)
        stub, fd_slot = self.area.address, self.area.address + 256
        code, trap = stub_code(stub, fd_slot)
        self.area.write(stub, code)
        self.area.write(fd_slot, struct.pack("<i", self.pidfd))
        self.trap = stub + trap
        jump = jmp_rel32(at, stub)
        rips = [tracee.get_regs(t).rip for t in tracee.threads if not tracee.threads[t].gone]
        # bytes 1..4 after a lone ret are alignment padding, never executed
        self.patches.apply(tracee.mem, [Patch(at, head, jump, "loader watch _dl_debug_state")], rips)
        return True

    def claim(self, tracee: Tracee, event: SignalStop) -> bool:
        if tracee is not self.tracee or not self.trap or event.signum != signal.SIGTRAP:
            return False
        if tracee.get_regs(event.tid).rip != self.trap + 1:
            return False
        if struct.unpack("<i", tracee.mem.read(self.r_debug + R_STATE_OFFSET, 4))[0] == RT_CONSISTENT:
            self.changes += 1
            self.on_change(event.tid)
        tracee.resume(event.tid, 0)
        return True

    def remove(self) -> None:
        """Every thread stopped: the loader's bytes back and the pidfd closed; the
        stub's area goes with the process's MadtraceAreas (mappings.py), which keeps
        it while a thread is inside."""
        if not self.patches.applied or not self.tracee.threads:
            return
        self.patches.revert(self.tracee.mem)
        if self.pidfd >= 0:
            with RemoteSyscalls(self.tracee) as rs:
                rs.call("close", self.pidfd)
            self.pidfd = -1
        self.trap = 0
