"""The allocation tracker (MadT's dynamic memory tracker).

malloc, calloc, realloc and free of libc are tracked with breakpoints: at a
function's entry the tracer reads the arguments and the return address,
replaces the return address with a trap in madtrace's code, and steps over
the breakpoint; at the trap it reads the result and jumps to the real
return address.  Each block gets MadT's forged name: allocator, a
program-wide counter and the call site, ``<malloc0014@build_list+39>``; a
freed block keeps its number, as ``<freed:0014@build_list+39>``, so that
accesses to released memory stand out.  Events are written to
``data/allocations.json`` with the thread and the position in its call
records (the same ``seq`` as accesses).
"""

from __future__ import annotations

import bisect
import json
import os
import signal
from dataclasses import asdict, dataclass

import numpy as np

from ..binary.address_space import AddressSpace
from ..errors import UnknownSymbolError
from ..inject.areas import SharedArea
from ..process import ptrace_raw as pr
from ..process.events import SignalStop
from ..process.remote_syscall import RemoteSyscalls
from ..process.tracee import Tracee

TRACKED = ("malloc", "calloc", "realloc", "free")
INT3 = b"\xcc"


@dataclass
class Block:
    id: int
    kind: str            # malloc / calloc / realloc
    address: int
    size: int
    site: str            # caller function+offset (decimal, as MadT)
    tid: int
    seq: int
    order: int           # position among all events the tracer saw (accesses included)
    freed_seq: int | None = None
    freed_tid: int | None = None
    freed_order: int | None = None

    @property
    def name(self) -> str:
        prefix = f"<{self.kind}" if self.freed_seq is None else "<freed:"
        return f"{prefix}{self.id:04d}@{self.site}>"


class AllocTracker:
    def __init__(self, tracee: Tracee, space: AddressSpace, sequence_of, next_order):
        self.next_order = next_order
        self.tracee = tracee
        self.space = space
        self.sequence_of = sequence_of
        self.entries: dict[int, str] = {}         # breakpoint address -> function
        self.saved_byte: dict[int, bytes] = {}
        self.pending: dict[int, list] = {}        # tid -> [(function, args, return address, rsp)]
        self.blocks: list[Block] = []
        self.live_starts: list[int] = []          # sorted addresses of live blocks
        self.live: dict[int, Block] = {}
        self.freed: dict[int, Block] = {}         # address -> last freed block there
        self.freed_starts: list[int] = []
        self.trap = 0
        self.leftover: dict[int, list] = {}     # pending calls when the breakpoints were removed
        self.missed_windows = 0
        self.events = 0          # allocator calls seen (also the version of _arrays)
        self._arrays = None      # (events, numpy tables for blocks_of)
        self.active = False

    # -------------------------------------------------------------- install
    def install(self, rs: RemoteSyscalls, patched: set[int]) -> list[str]:
        """Breakpoints on libc's allocator; ``patched``: addresses already patched
        by function tracing (left alone). Returns warnings."""
        warnings = []
        for name in TRACKED:
            try:
                address = self.space.find_symbol(f"libc.so.6:{name}").address
            except UnknownSymbolError:
                warnings.append(f"{name} not found in libc: not tracked")
                continue
            if address in patched:
                warnings.append(f"{name} is patched for function tracing: its blocks are not named")
                continue
            self.entries[address] = name
        area = SharedArea(rs, 4096, "madtrace-alloc-trap", executable=True)
        area.write(area.address, INT3 * 16)
        self.trap = area.address
        for address in self.entries:
            self.saved_byte[address] = self.tracee.mem.read(address, 1)
            self.tracee.mem.write(address, INT3)
        self.active = True
        return warnings

    def remove(self, mem=None) -> None:
        """Take the breakpoints out (of ``mem``: a fork child's copy), and give every
        thread still inside a tracked call its real return address back."""
        mine = mem is None
        mem = mem or self.tracee.mem
        for address, byte in self.saved_byte.items():
            if mem.read(address, 1) == INT3:
                mem.write(address, byte)
        if mine:
            self.leftover = {tid: list(stack) for tid, stack in self.pending.items()}
            for stack in self.pending.values():
                for _name, _args, return_address, rsp in stack:
                    try:
                        if mem.read_u64(rsp) == self.trap:
                            mem.write_u64(rsp, return_address)
                    except Exception:
                        pass  # the frame is gone (longjmp)
            self.pending.clear()
            self.active = False

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
            if regs.rip - 1 in self.entries:
                regs.rip -= 1
            elif regs.rip == self.trap + 1 and self.leftover.get(tid):
                regs.rip = self.leftover[tid].pop()[2]
            else:
                return False
            tracee.set_regs(regs, tid)
            tracee.resume(tid, 0)
            return True
        if regs.rip - 1 in self.entries:
            self._on_entry(tid, regs)
            return True
        if regs.rip == self.trap + 1:
            self._on_return(tid, regs)
            return True
        return False

    def _on_entry(self, tid: int, regs) -> None:
        address = regs.rip - 1
        name = self.entries[address]
        return_address = self.tracee.mem.read_u64(regs.rsp)
        self.pending.setdefault(tid, []).append((name, (regs.rdi, regs.rsi), return_address, regs.rsp))
        self.tracee.mem.write_u64(regs.rsp, self.trap)
        regs.rip = address
        self.tracee.set_regs(regs, tid)
        # step over the breakpoint: original byte back for one instruction
        if len(self.tracee.threads) > 1:
            self.missed_windows += 1
        self.tracee.mem.write(address, self.saved_byte[address])
        state = self.tracee.threads[tid]
        while True:
            pr.singlestep(tid, 0)
            state.running = True
            event = self.tracee.wait_event(block=True, tid=tid)
            if isinstance(event, SignalStop) and event.signum != signal.SIGTRAP:
                state.pending_signal = event.signum
                continue
            break
        self.tracee.mem.write(address, INT3)
        self.tracee.resume(tid, 0)

    def _on_return(self, tid: int, regs) -> None:
        stack = self.pending.get(tid) or []
        # the call whose frame this is: entry rsp + 8 == rsp now (frames above it were
        # left by longjmp)
        while stack and stack[-1][3] + 8 < regs.rsp:
            stack.pop()
        name, (a0, a1), return_address, _ = stack.pop()
        result = regs.rax
        self._record(tid, name, a0, a1, result, return_address)
        regs.rip = return_address
        self.tracee.set_regs(regs, tid)
        self.tracee.resume(tid, 0)

    # ---------------------------------------------------------------- blocks
    def _site(self, return_address: int) -> str:
        """The calling instruction as MadT names it: function+decimal offset."""
        return self.space.code_location(return_address - 5, decimal=True)

    def _record(self, tid, name, a0, a1, result, return_address) -> None:
        self.events += 1
        seq = self.sequence_of(tid)
        if name == "free":
            self._release(a0, tid, seq)
            return
        if name == "realloc" and a0:
            if result:
                self._release(a0, tid, seq)
            elif a1:
                return  # failed realloc: the old block stays
        if not result:
            return
        size = a0 * a1 if name == "calloc" else (a1 if name == "realloc" else a0)
        block = Block(len(self.blocks) + 1, name, result, size, self._site(return_address), tid, seq,
                      self.next_order())
        self.blocks.append(block)
        self.live[result] = block
        bisect.insort(self.live_starts, result)
        if result in self.freed:   # the address is reused: the freed block is gone
            del self.freed[result]
            del self.freed_starts[bisect.bisect_left(self.freed_starts, result)]

    def _release(self, address: int, tid: int, seq: int) -> None:
        block = self.live.pop(address, None)
        if block is None:
            return
        i = bisect.bisect_left(self.live_starts, address)
        del self.live_starts[i]
        block.freed_seq, block.freed_tid, block.freed_order = seq, tid, self.next_order()
        if address not in self.freed:
            bisect.insort(self.freed_starts, address)
        self.freed[address] = block

    def block_at(self, address: int) -> Block | None:
        """The live block containing ``address``, else the last freed one there."""
        for starts, table in ((self.live_starts, self.live), (self.freed_starts, self.freed)):
            i = bisect.bisect_right(starts, address) - 1
            if i >= 0:
                block = table[starts[i]]
                if address < block.address + max(block.size, 1):
                    return block
        return None

    def blocks_of(self, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``block_at`` for an array of addresses: (block ids, 0 or 1 freed); 0: no block."""
        ids = np.zeros(len(addresses), dtype=np.uint32)
        freed = np.zeros(len(addresses), dtype=np.uint8)
        if self._arrays is None or self._arrays[0] != self.events:
            tables = []
            for starts, table in ((self.live_starts, self.live), (self.freed_starts, self.freed)):
                blocks = [table[a] for a in starts]
                tables.append((np.array(starts, dtype=np.uint64),
                               np.array([b.address + max(b.size, 1) for b in blocks], dtype=np.uint64),
                               np.array([b.id for b in blocks], dtype=np.uint32)))
            self._arrays = (self.events, tables)
        for flag, (starts, ends, block_ids) in enumerate(self._arrays[1]):
            if not len(starts):
                continue
            i = np.searchsorted(starts, addresses, side="right") - 1
            j = np.maximum(i, 0)
            hit = (i >= 0) & (ids == 0) & (addresses < ends[j])
            ids[hit] = block_ids[j[hit]]
            freed[hit] = flag
        return ids, freed

    def write(self, out_dir: str) -> None:
        os.makedirs(os.path.join(out_dir, "data"), exist_ok=True)
        with open(os.path.join(out_dir, "data", "allocations.json"), "w") as f:
            json.dump([dict(asdict(b), name=b.name) for b in self.blocks], f)
