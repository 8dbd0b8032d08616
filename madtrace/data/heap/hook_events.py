# SPDX-License-Identifier: GPL-2.0-or-later
"""The hook stubs' records, as the tracer takes them (hybrid data engine).

The hook stubs (inline_hooks.py; layout.h "Hook stubs") write a group of
records into the thread's ring at the entry of malloc & co. and of
memcpy/memmove/memset, and another when an allocator call returns.  The
drain (ring_split.py) hands each group over in ring order: the data records
written before it are named first, with the heap as it was, the group is
applied here, then the data records after it.  Across threads the order is
the stamps': an allocator call's return group takes the next stamp of the
control block's epoch (lock xadd in the stub), and every data record and
entry group carries the epoch it read, so the drain applies the return
groups in stamp order and takes an access only once every allocation event
before it is applied: an access is named after exactly the malloc and free
calls that came before it, whichever thread made them.

Here, per thread, as the breakpoint hooks did (call_hooks.py, alloc.py,
block_events.py):

* an allocator entry pushes the call (its arguments, the event order at the
  entry, its stack pointer) on the thread's stack of calls in flight; a call
  whose stack pointer lies below a newer entry's or return's was left by
  longjmp, and goes;
* an allocator return pops its call, writes the allocator call
  (allocator_calls.bin) and names the block (alloc.py ``call_returned``);
* a memcpy/memmove/memset entry (written only when a buffer reached traced
  pages, which the call then reached through the alias) is a Y or W block
  event (block_events.py ``mem_event``).

A group that could not go into the ring (a thread without a ring, a ring
that stayed full) stops the stub at its int3; the tracer applies it from the
registers (``synchronous``) with the stamp the stub took, or one of its own.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...target.templates import load_injector
from ...trace.block_event_records import WHAT_CODES


class HookEvents:
    def __init__(self, engine, hooks):
        """``hooks``: the InlineHooks whose stubs write the groups (``by_index``)."""
        self.engine = engine
        self.hooks = hooks
        self.L = load_injector()
        self.entry_kind = self.L.MT_HOOK_ENTRY
        # tid -> [(hook, state of alloc.call_entered, entry rsp low 32, return address)]
        self.calls: dict[int, list] = {}
        self.unmatched_returns = 0           # a return whose entry was not recorded
        self._tables_made: tuple | None = None

    # ------------------------------------------------------------- ordering
    def _order(self) -> int:
        """The next event order, inside the drain (every earlier record is taken)."""
        return self.engine.order.tick()

    # -------------------------------------------------------------- groups
    def take_group(self, tid: int, group: tuple) -> None:
        """One group of thread ``tid`` (a ring_split.HOOK_OUT_DTYPE row as a tuple:
        a0, a1, a2, ret, seq, data_before, position, code, stamp, rsp, flags), in order."""
        a0, a1, a2, ret, seq, _, _, code, _, rsp, _ = group
        hook = self.hooks.by_index[(code >> 2) & 0x3FF]
        if code & 3 == self.entry_kind:
            self.entered(tid, hook, a0, a1, a2, ret, rsp, seq)
        else:
            self.returned(tid, hook, a0, rsp, seq)

    def entered(self, tid: int, hook, a0: int, a1: int, a2: int, return_address: int,
                rsp: int, seq: int) -> None:
        hook.entries += 1
        return_address = self._program_return(tid, return_address)
        if hook.role == "mem":
            self.engine.blocks.mem_event(tid, hook.name, a0, a1, a2, return_address,
                                         lambda: seq, self._order)
            return
        stack = self.calls.setdefault(tid, [])
        while stack and _below(stack[-1][2], rsp):
            stack.pop()        # left by longjmp: this entry comes from a frame above it
        state = self.engine.alloc.call_entered(a0, a1, self._order())
        stack.append((hook, state, rsp, return_address))

    def _program_return(self, tid: int, return_address: int) -> int:
        """The program's return address of a hooked call: a call an allocator makes
        as its tail call (calloc's memset, realloc's malloc) returns into the stub
        that called the allocator; it is the allocator's call, from the program's
        call site, that is in flight on the thread."""
        if not self.hooks.in_stub(return_address):
            return return_address
        stack = self.calls.get(tid)
        return stack[-1][3] if stack else return_address

    def returned(self, tid: int, hook, result: int, rsp: int, seq: int) -> None:
        hook.returns += 1
        stack = self.calls.get(tid) or []
        while stack and _below(stack[-1][2], rsp):
            stack.pop()        # left by longjmp from inside this call
        if not stack or stack[-1][2] != rsp or stack[-1][0] is not hook:
            self.unmatched_returns += 1        # its entry came before recording began
            return
        _, state, _, return_address = stack.pop()
        self.engine.alloc.call_returned(tid, hook.kind, state, result, return_address,
                                        self._order(), lambda: seq, self._order)

    # ------------------------------------------- memcpy & co., many at once
    # (records.py ``HookBatch``: the drain takes a batch's memcpy/memmove/memset entries
    # together, between its allocator groups, which alone change the heap)
    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """By hook index: the hook is a memcpy/memmove/memset one; a memcpy or
        memmove one (the others set); its name's block event code."""
        size = max(self.hooks.by_index, default=-1) + 1
        if self._tables_made is None or len(self._tables_made[0]) != size:
            mem, copies = np.zeros(size, dtype=bool), np.zeros(size, dtype=bool)
            whats = np.zeros(size, dtype=np.uint8)
            for index, hook in self.hooks.by_index.items():
                mem[index] = hook.role == "mem"
                if mem[index]:
                    copies[index] = hook.name != "memset"
                    whats[index] = WHAT_CODES[hook.name]
            self._tables_made = (mem, copies, whats)
        return self._tables_made

    def batched(self, groups: np.ndarray) -> np.ndarray:
        codes = groups["code"]
        index = (codes >> 2) & 0x3FF
        table = self._tables()[0]
        known = index < len(table)
        mem = np.zeros(len(groups), dtype=bool)
        mem[known] = table[index[known]]
        return mem & ((codes & 3) == self.entry_kind)

    def recorded(self, tid: int, groups: np.ndarray) -> np.ndarray:
        copies = self._tables()[1][(groups["code"] >> 2) & 0x3FF]
        return self.engine.blocks.mem_recorded(tid, groups["a0"], groups["a1"], groups["a2"],
                                               copies)

    def take(self, tid: int, groups: np.ndarray, events: np.ndarray, orders: np.ndarray) -> None:
        _mem, copies, whats = self._tables()
        index = (groups["code"] >> 2) & 0x3FF
        counts = np.bincount(index, minlength=len(whats))
        by_index = self.hooks.by_index
        for k in np.flatnonzero(counts).tolist():
            by_index[k].entries += int(counts[k])
        chosen, index = groups[events], index[events]
        returns = chosen["ret"]
        in_stubs = self.hooks.in_stubs(returns)
        if in_stubs.any():       # tail calls of an allocator in flight (_program_return)
            returns = returns.copy()
            returns[in_stubs] = self._program_return(tid, int(returns[in_stubs][0]))
        self.engine.blocks.mem_events(tid, whats[index], copies[index], chosen["a0"],
                                      chosen["a1"], chosen["a2"], returns, chosen["seq"],
                                      orders)
        self.engine.blocks.redirected += len(groups)

    # ------------------------------------------------------------ queries
    @property
    def counts(self) -> Counter:
        """Groups applied, by kind (alloc entries, alloc returns, mem entries)."""
        out: Counter = Counter()
        for hook in self.hooks.hooks:
            out[f"{hook.role} entries"] += hook.entries
            out[f"{hook.role} returns"] += hook.returns
        return +out

    def inside_allocator(self) -> set[int]:
        """Threads inside an allocator call (as far as the groups taken so far say)."""
        return {tid for tid, stack in list(self.calls.items()) if stack}

    def open_allocator_calls(self):
        """(tid, state) of every allocator call whose return was not seen."""
        for tid, stack in self.calls.items():
            for _hook, state, _rsp, _ret in stack:
                yield tid, state

    def thread_exited(self, tid: int) -> None:
        self.calls.pop(tid, None)


def _below(rsp: int, other: int) -> bool:
    """Stack address ``rsp`` lies below ``other`` (both their low 32 bits)."""
    return 0 < ((other - rsp) & 0xFFFFFFFF) < 1 << 31
