# SPDX-License-Identifier: GPL-2.0-or-later
"""Entry and return hooks on a few functions, with breakpoints.

At a hooked function's entry (an int3) the tracer reads the arguments and
the return address, replaces the return address with a trap in madtrace's
code (one int3 per pending call), steps over the breakpoint and calls
``on_entry``; at the trap it calls ``on_return`` with the registers (the
result) and jumps to the real return address.  A frame left by longjmp is
dropped at the thread's next return (its stack pointer is below the
returning one).  Every breakpoint and pending call is also in the guard's
table (guard.py), so that the target outlives a tracer killed meanwhile.
Used by the allocation tracker (malloc & co.) and by the data gate
(--data-in FUNC).  ``own`` breakpoints are int3 instructions of madtrace's
own code (a hook stub's slow path, inline_hooks.py), where the stop looks
like a function entry: there is no byte to step over, the thread goes on
after the int3 (and with no tracer left, the guard turns it into a nop).
"""

from __future__ import annotations

import signal
from typing import Callable

from ...arch.x86_64.decode import decode_one
from ...binary.maps import read_maps
from ...target.areas import SharedArea
from ...process.events import SignalStop
from ...process.kill_points import kill_point
from ...process.remote_syscall import RemoteSyscalls
from ...process.stepping import step
from ...process.tracee import Tracee
from ...trace.format import PAGE

INT3 = b"\xcc"
NOP = b"\x90"
TRAPS = 4096            # one trap per pending call; the last one for calls the guard misses
UNGUARDED = TRAPS - 1
TRAP_SIZE = 2           # two int3s each (the second: see _cover)
MAX_COVER = 8           # int3s over a function's first instruction (the guard's table)


class CallHooks:
    max_cover = MAX_COVER     # the most bytes a breakpoint's int3s cover from its address
    def __init__(self, tracee: Tracee, name: str,
                 on_entry: Callable[[int, str, object], object],
                 on_return: Callable[[int, str, object, object, int], None], guard=None,
                 step_fault: Callable[[int, SignalStop], bool] | None = None):
        """``on_entry(tid, function, regs) -> state`` at an entry;
        ``on_return(tid, function, state, regs, return_address)`` at its return;
        ``guard``: the data engine's guard (guard.py); ``step_fault(tid, event)``:
        the data engine's answer to a fault of the instruction stepped over a
        breakpoint (True: it carried the instruction out)."""
        self.guard = guard
        self.step_fault = step_fault
        self.unguarded_calls = 0
        self.tracee = tracee
        self.name = name
        self.on_entry = on_entry
        self.on_return = on_return
        self.entries: dict[int, str] = {}         # breakpoint address -> function
        # breakpoint address -> the bytes its int3s replace (the first instruction's)
        self.saved_bytes: dict[int, bytes] = {}
        self.own: set[int] = set()                # int3s of madtrace's code (see the module)
        # tid -> [(function, state, return address, rsp, trap index)]
        self.pending: dict[int, list] = {}
        self.leftover: dict[int, list] = {}       # pending calls when the breakpoints were removed
        self.trap = 0
        self.stops = 0             # ptrace stops taken here (entries and returns)
        self.missed_windows = 0
        self.active = False

    def install(self, rs: RemoteSyscalls, functions: dict[int, str], own: bool = False) -> None:
        self.entries = dict(functions)
        if own:
            self.own = set(functions)
        area = SharedArea(rs, TRAPS * TRAP_SIZE, f"madtrace-{self.name}-trap", executable=True)
        area.write(area.address, INT3 * (TRAPS * TRAP_SIZE))
        self.trap = area.address
        if self.guard is not None and self.entries:
            self.guard.install_traps(rs)
        maps = read_maps(self.tracee.pid)
        for address in self.own:
            if self.guard is not None:
                self.guard.add_breakpoint(address, NOP, 5)
        for address in set(self.entries) - self.own:
            self.saved_bytes[address] = self._cover(address)
            if self.guard is not None:
                mapping = next((m for m in maps if m.start <= address < m.end), None)
                prot = _prot(mapping.perms) if mapping else 5
                self.guard.add_breakpoint(address, self.saved_bytes[address], prot)
            self.tracee.mem.write(address, INT3 * len(self.saved_bytes[address]))
        self.active = True

    def remove(self, mem=None) -> None:
        """Take the breakpoints out (of ``mem``: a fork child's copy), and give every
        thread still inside a hooked call its real return address back."""
        mine = mem is None
        mem = mem or self.tracee.mem
        for address, original in self.saved_bytes.items():
            if mem.read(address, 1) == INT3:
                mem.write(address, original)
        if mine:
            if self.guard is not None:
                self.guard.remove_breakpoints(set(self.saved_bytes) | self.own)
            self.leftover = {tid: list(stack) for tid, stack in self.pending.items()}
            for stack in self.pending.values():
                for _name, _state, return_address, rsp, index in stack:
                    try:
                        if mem.read_u64(rsp) == self.trap_address(index):
                            mem.write_u64(rsp, return_address)
                    except Exception:
                        pass  # the frame is gone (longjmp)
                    self._free(index)
            self.pending.clear()
            self.active = False

    def _cover(self, address: int) -> bytes:
        """The bytes the int3s at a function's entry replace: its whole first
        instruction (up to MAX_COVER bytes, within its page).  A thread resumed
        one byte after the first int3 (its tracer died after taking that stop,
        so the kernel never delivers its SIGTRAP) runs into the next int3, and
        the guard sends it back to the entry; one int3 alone left it in the
        middle of the instruction (a load of a global ran as "or eax, imm32").
        A first instruction of one byte (push rbp) keeps that window."""
        code = self.tracee.mem.read(address, min(16, PAGE - address % PAGE))  # its page only
        insn = decode_one(code, address, detail=False)
        n = insn.size if insn is not None else 1
        return code[:max(1, min(n, MAX_COVER))]

    def trap_address(self, index: int) -> int:
        return self.trap + index * TRAP_SIZE

    def trap_index(self, address: int) -> int | None:
        """The trap whose first int3 is at ``address`` (None: not a trap)."""
        offset = address - self.trap
        if self.trap and 0 <= offset < TRAPS * TRAP_SIZE and offset % TRAP_SIZE == 0:
            return offset // TRAP_SIZE
        return None

    def _free(self, index: int) -> None:
        if self.guard is not None and index != UNGUARDED:
            self.guard.free_trap(index)

    def thread_exited(self, tid: int) -> None:
        for entry in self.pending.pop(tid, []):
            self._free(entry[4])

    def depth(self, tid: int) -> int:
        return len(self.pending.get(tid, ()))

    # ---------------------------------------------------------------- stops
    def claim_trap(self, tracee: Tracee, event: SignalStop, regs) -> bool:
        """A SIGTRAP stop (``regs``: the thread's registers there): ours if it is a
        breakpoint or the return trap, also just after the breakpoints were removed."""
        if tracee is not self.tracee or not self.entries:
            return False
        tid = event.tid
        if not self.active:
            # a breakpoint or return trap hit just before the breakpoints were taken
            # out, reported after: finish the call as if nothing had been there
            index = self.trap_index(regs.rip - 1)
            if regs.rip - 1 in self.own:
                pass                           # goes on after its int3
            elif regs.rip - 1 in self.entries:
                regs.rip -= 1
            elif index is not None and any(e[4] == index for e in self.leftover.get(tid, ())):
                regs.rip = next(e[2] for e in self.leftover[tid] if e[4] == index)
            else:
                return False
            tracee.set_regs(regs, tid)
            tracee.resume(tid, 0)
            return True
        if regs.rip - 1 in self.entries:
            kill_point("breakpoint", f"thread {tid} at {regs.rip - 1:#x}")
            self.stops += 1
            self._entry(tid, regs)
            return True
        if self.trap_index(regs.rip - 1) is not None:
            kill_point("return-trap", f"thread {tid} at {regs.rip - 1:#x}")
            self.stops += 1
            self._return(tid, regs)
            return True
        return False

    def _entry(self, tid: int, regs) -> None:
        address = regs.rip - 1
        name = self.entries[address]
        return_address = self.tracee.mem.read_u64(regs.rsp)
        stack = self.pending.setdefault(tid, [])
        while stack and stack[-1][3] < regs.rsp:
            self._free(stack.pop()[4])   # left by longjmp: we are above its frame now
        if address not in self.own:
            # back on the breakpoint before on_entry's system calls: a tracer killed
            # during one leaves the thread where the call page's restore code puts
            # it, its registers as saved; one byte after the int3 is the middle of
            # the function's first instruction (--data-in's arm: a load of a global
            # became "or eax, imm32" and the program computed a wrong result).  On
            # the int3, it takes the trap again and the guard runs the instruction.
            regs.rip = address
            self.tracee.set_regs(regs, tid)
        state = self.on_entry(tid, name, regs)
        index = self.guard.new_trap() if self.guard is not None else UNGUARDED
        if index < 0:
            index = UNGUARDED
            self.unguarded_calls += 1   # a tracer killed during this call kills the target
        if index != UNGUARDED:
            self.guard.set_trap(index, self.trap_address(index), return_address, regs.rsp)
        stack.append((name, state, return_address, regs.rsp, index))
        self.tracee.mem.write_u64(regs.rsp, self.trap_address(index))
        if address in self.own:             # on after the int3, nothing to step over
            self.tracee.set_regs(regs, tid)
            self.tracee.resume(tid, 0)
            return
        regs.rip = address
        self.tracee.set_regs(regs, tid)
        # step over the breakpoint: original byte back for one instruction
        if len(self.tracee.threads) > 1:
            self.missed_windows += 1
        self.tracee.mem.write(address, self.saved_bytes[address])
        thread = self.tracee.threads[tid]
        while True:
            event = step(self.tracee, tid)
            if isinstance(event, SignalStop) and event.signum != signal.SIGTRAP:
                # the instruction touched a page data tracing protects (--data-in has
                # just protected them, and a function's first instruction may read a
                # global): the data engine records it and carries it out; stepped
                # again, it would fault again, forever
                if event.signum == signal.SIGSEGV and self.step_fault is not None \
                        and self.step_fault(tid, event):
                    break
                thread.pending_signal = event.signum
                continue
            break
        self.tracee.mem.write(address, INT3 * len(self.saved_bytes[address]))
        self.tracee.resume(tid, 0)

    def _return(self, tid: int, regs) -> None:
        stack = self.pending.get(tid) or []
        # the call whose frame this is: entry rsp + 8 == rsp now (frames above it were
        # left by longjmp)
        while stack and stack[-1][3] + 8 < regs.rsp:
            self._free(stack.pop()[4])
        name, state, return_address, _, index = stack.pop()
        # in the caller before on_return's system calls: a tracer killed during one
        # leaves the thread where the call page's restore code puts it, its saved
        # registers; back on its trap, it died (the guard, having given everything
        # back on a signal queued for the scope's end, no longer knew the trap)
        regs.rip = return_address
        self.tracee.set_regs(regs, tid)
        self.on_return(tid, name, state, regs, return_address)
        self._free(index)       # after: until then a thread one int3 on is sent back
        self.tracee.resume(tid, 0)


def _prot(perms: str) -> int:
    return (1 if perms[0] == "r" else 0) | (2 if perms[1] == "w" else 0) | \
        (4 if perms[2] == "x" else 0)
