# SPDX-License-Identifier: GPL-2.0-or-later
"""The data engine's area in the target: per-thread slots and access stubs.

Layout (injector/layout.h, "data area"): MT_DATA_SLOTS slots, then stubs.
A stub serves one (instruction, slot) pair: the instruction re-encoded with
its memory operand redirected to the slot (arch/x86_64/redirect.py), then
the ``dataslot`` tail of injector/trampolines.S (mark the slot done, jump
back after the original instruction).  The area is one memfd mapped RWX in
the target (the stub writes its slot) and RW in the tracer, which writes
stubs and slots with plain memory accesses.

Hybrid engine (``through_alias``): a page reached through its alias is read
and written by relocated code without a stop, so a store kept in a slot until
the tracer's next stop could be read as the old value there.  Each stub then
has a second form, the *alias stub* (arch/x86_64/alias_access.py): the
instruction carried out on the operand's alias address, which the loop
writes into the slot at each fault; the store is in memory when the stub's
instruction has run, and nothing is written back.  An instruction without an
alias form takes the slow path on such pages (the loop hands it back).

Slots: each thread has a home slot.  A slot is busy from the fault that
fills it until the tracer's next stop after its stub ran (then its bytes are
written back for a store).  A thread whose home slot is still busy (its
stub was interrupted by a signal before it ran) moves to a free slot.

The area is never unmapped: a signal frame may hold a stub address.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

from ...arch.x86_64.alias_access import alias_access
from ...arch.x86_64.memops import MemInstruction
from ...arch.x86_64.redirect import emulation, redirect_operand, redirectable
from ...arch.x86_64.relocate import Refusal
from ...errors import TracerInternalError
from ...target.areas import SharedArea
from ...target.templates import load_injector
from ...process.fastloop import ANY_SLOT, OP_CALL, OP_JMP, OP_MOVS, OP_STOS, FaultLoop
from ...process.remote_syscall import RemoteSyscalls
from ...process.tracee import Tracee

AREA_SIZE = 16 << 20
STUB_ALIGN = 16


class DataArea:
    def __init__(self, tracee: Tracee, rs: RemoteSyscalls):
        self.tracee = tracee
        self.L = load_injector()
        self.tail = self.L.templates["dataslot"]
        self.area = SharedArea(rs, AREA_SIZE, "madtrace-data", executable=True, writable_code=True)
        self.loop = FaultLoop(tracee.pid, self.area.local, self.area.address)
        self.cursor = self.area.address + self.L.MT_DATA_STUBS
        self.stubs: dict[tuple[int, int], int] = {}       # (rip, slot) -> stub
        self.emulated: dict[int, str] = {}                # rip -> what the C loop carries out
        self.refused: dict[int, str] = {}                 # rip -> why it takes the slow path
        self.home: dict[int, int] = {}                    # tid -> slot
        self.free_slots = list(range(self.L.MT_DATA_SLOTS))
        self._stub_starts: list[int] = []
        self._stub_info: dict[int, StubInfo] = {}
        self.full = False
        self.through_alias = False      # hybrid engine: alias stubs too (see the module)
        # ids_of(insn, how) -> (id, id2, id3): instruction ids of its records when the
        # loop writes them into the rings (hybrid engine, paths.py); None: it does not
        self.ids_of = None

    # ------------------------------------------------------------------ slots
    def slot_address(self, slot: int) -> int:
        return self.area.address + slot * self.L.MT_DSLOT_SIZE

    def _slot_u64(self, slot: int, field: int, value: int | None = None) -> int:
        offset = slot * self.L.MT_DSLOT_SIZE + field
        if value is None:
            return struct.unpack_from("<Q", self.area.local, offset)[0]
        struct.pack_into("<Q", self.area.local, offset, value)
        return value

    def busy(self, slot: int) -> bool:
        return self._slot_u64(slot, self.L.MT_DSLOT_ADDR) != 0

    def add_thread(self, tid: int, head_address: int) -> bool:
        if tid in self.home:
            return True
        if not self.free_slots:
            return False
        slot = self.home[tid] = self.free_slots.pop(0)
        self.loop.set_thread(tid, slot, head_address)
        return True

    def remove_thread(self, tid: int) -> None:
        slot = self.home.pop(tid, None)
        self.loop.remove_thread(tid)
        if slot is not None:
            self.loop.flush()
            # a slot whose stub never ran (its thread is gone) is dropped, never reused
            if not self.busy(slot):
                self.free_slots.append(slot)

    def move_thread(self, tid: int, head_address: int) -> int | None:
        """Give a thread whose home slot is busy another free slot."""
        if not self.free_slots:
            return None
        slot = self.home[tid] = self.free_slots.pop(0)
        self.loop.set_thread(tid, slot, head_address)
        return slot

    # ------------------------------------------------------------------ stubs
    def contains(self, address: int) -> bool:
        return self.area.address <= address < self.area.end

    def register(self, insn: MemInstruction, slot: int) -> bool:
        """Give the instruction to the loop: carried out there (``emulated``) or
        through its stub for ``slot`` (built once); False if it takes the slow path."""
        key = (insn.address, slot)
        if key in self.stubs or insn.address in self.emulated:
            return True
        if insn.address in self.refused:
            return False
        how = emulation(insn)
        if how is not None:
            op = insn.operands[-1] if how != "stos" else insn.operands[0]
            self.loop.add_instruction(insn.address, ANY_SLOT, 0, op.base, op.index, op.scale,
                                      op.disp, op.segment, op.size, op.load, op.store, insn.size,
                                      addr32=False, atomic=False, op=_OPS[how], rep=insn.rep,
                                      ids=self.ids_of(insn, how) if self.ids_of else (0, 0, 0))
            self.emulated[insn.address] = how
            return True
        why = redirectable(insn)
        stub = alias_stub = 0
        if why is None:
            stub = self._build(insn, slot, through_alias=False)
            if isinstance(stub, str):
                why = stub
        if why is None and self.through_alias:
            alias_stub = self._build(insn, slot, through_alias=True)
            if isinstance(alias_stub, str):
                why = f"no alias form: {alias_stub}"
        if why is not None:
            self.refused[insn.address] = why
            return False
        self.stubs[key] = stub
        op = insn.operands[0]
        self.loop.add_instruction(insn.address, slot, stub, op.base, op.index, op.scale, op.disp,
                                  op.segment, op.size, op.load, op.store, insn.size,
                                  addr32=op.base in _REG32 or op.index in _REG32,
                                  atomic=insn.atomic,
                                  ids=self.ids_of(insn, None) if self.ids_of else (0, 0, 0),
                                  alias_stub=alias_stub)
        return True

    def _build(self, insn: MemInstruction, slot: int, through_alias: bool) -> int | str:
        code = self.tracee.mem.read(insn.address, insn.size)
        at = self.cursor
        base = self.slot_address(slot)
        reg, insn_at, insn_end = None, 0, 0
        if through_alias:
            made = alias_access(code, insn.address, at, base + self.L.MT_DSLOT_SAVED,
                                base + self.L.MT_DSLOT_ALIAS)
            if isinstance(made, Refusal):
                return str(made)
            body = made.code
            reg, insn_at, insn_end = made.reg, at + made.insn_at, at + made.insn_end
        else:
            body = redirect_operand(code, insn.address, at, base + self.L.MT_DSLOT_BYTES)
            if not isinstance(body, bytes):
                return str(body)
        tail_at = at + len(body)
        body += bytes(self.tail.instantiate(
            tail_at, done=base + self.L.MT_DSLOT_DONE, **{"return": insn.end}))
        if at + len(body) > self.area.end:
            self.full = True
            return "the data area is full"
        self.area.write(at, body)
        self.cursor = (at + len(body) + STUB_ALIGN - 1) & ~(STUB_ALIGN - 1)
        bisect.insort(self._stub_starts, at)
        self._stub_info[at] = StubInfo(insn.address, insn.end, tail_at, slot, reg, insn_at, insn_end)
        return at

    # ---------------------------------------------------------------- leaving
    def leave(self, tid: int) -> None:
        """Move a stopped thread out of a stub (tracing ends): before its
        instruction ran, back onto the original instruction (which runs again
        natively on the open page); after it, on the next instruction (the
        slot is written back by the flush that precedes this, or here when the
        thread stopped before the tail marked it done; an alias stub's access is
        in memory already, and its register gets its value back)."""
        state = self.tracee.threads.get(tid)
        if state is None or state.running:
            return
        regs = self.tracee.get_regs(tid)
        if not self.contains(regs.rip) or regs.rip < self.area.address + self.L.MT_DATA_STUBS:
            return
        i = bisect.bisect_right(self._stub_starts, regs.rip) - 1
        if i < 0:
            raise TracerInternalError(f"thread {tid} at {regs.rip:#x} in the data area, in no stub")
        info = self._stub_info[self._stub_starts[i]]
        if info.reg is None:
            if regs.rip >= info.tail and self.busy(info.slot) and \
                    not self._slot_u64(info.slot, self.L.MT_DSLOT_DONE):
                # stopped on the tail's first instruction: its instruction ran (the
                # store is in the slot) but the slot is not marked done yet, and a
                # discard_unfinished would drop the store: written back now
                self._slot_u64(info.slot, self.L.MT_DSLOT_DONE, 1)
                self.loop.flush()
            regs.rip = info.original if regs.rip < info.tail else info.next_insn
        else:
            start = self._stub_starts[i]
            if start < regs.rip < info.tail:       # the register is saved, maybe changed
                setattr(regs, info.reg, self._slot_u64(info.slot, self.L.MT_DSLOT_SAVED))
            regs.rip = info.original if regs.rip <= info.insn_at else info.next_insn
        self.tracee.set_regs(regs, tid)

    def copies_out(self) -> bool:
        """Whether a slot holds a copy of an operand (a stub not run yet, or run
        since the last flush): its bytes go back to memory at a later flush."""
        return any(self.busy(slot) and self._slot_u64(slot, self.L.MT_DSLOT_LEN)
                   for slot in range(self.L.MT_DATA_SLOTS))

    def pending_slots(self) -> int:
        """Slots whose stub has not run yet."""
        return sum(1 for slot in range(self.L.MT_DATA_SLOTS)
                   if self.busy(slot) and not self._slot_u64(slot, self.L.MT_DSLOT_DONE))

    def discard_unfinished(self) -> int:
        """Free the slots whose stub never ran (their thread was moved out): their
        copy is stale.  Returns how many."""
        n = 0
        for slot in range(self.L.MT_DATA_SLOTS):
            if self.busy(slot) and not self._slot_u64(slot, self.L.MT_DSLOT_DONE):
                for field in (self.L.MT_DSLOT_LEN, self.L.MT_DSLOT_ADDR):
                    self._slot_u64(slot, field, 0)
                n += 1
        return n

    def close(self) -> None:
        self.loop.close()


@dataclass(frozen=True)
class StubInfo:
    original: int                 # the instruction's address
    next_insn: int                # the address after it
    tail: int                     # where the stub's tail begins (its instruction ran)
    slot: int
    reg: str | None = None        # an alias stub: its address register ...
    insn_at: int = 0              # ... and where its instruction begins and ends
    insn_end: int = 0


_OPS = {"jmp": OP_JMP, "call": OP_CALL, "movs": OP_MOVS, "stos": OP_STOS}
_REG32 = frozenset({"eax", "ebx", "ecx", "edx", "esi", "edi", "ebp", "esp",
                    *(f"r{i}d" for i in range(8, 16))})
