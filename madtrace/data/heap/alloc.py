"""The allocation tracker (MadT's dynamic memory tracker).

malloc, calloc, realloc and free of libc are tracked with entry and return
hooks: the arguments at the entry, the result at the return.  Under the
hybrid data engine those are hook stubs in the target (inline_hooks.py),
whose records come through the rings in order with the accesses
(hook_events.py calls ``call_entered`` and ``call_returned``); under the fault
engine, and for a function whose entry cannot take a stub, breakpoints
(call_hooks.py).  Each block gets MadT's forged name: allocator, a
program-wide counter and the call site, ``<malloc0014@build_list+39>``; a
freed block keeps its number, as ``<freed:0014@build_list+39>``, so that
accesses to released memory stand out.  Blocks go to the block table
(trace/blocks.py: ``data/blocks.bin``) as they come, with the thread and the
position in its call records (the same ``seq`` as accesses).

Per event the tracker does O(log blocks) work and keeps O(live blocks)
state: the live and the freed blocks are two interval indexes updated in
place (block_index.c), accesses are named in C a batch at a time, and each
block's row is written once, its release fields in place: memory does not
grow with the blocks that were freed.
"""

from __future__ import annotations

import threading

import numpy as np

from ...binary.address_space import AddressSpace
from ...errors import UnknownSymbolError
from ...process.events import SignalStop
from ...process.remote_syscall import RemoteSyscalls
from ...process.tracee import Tracee
from ...trace.allocator_calls import OPEN, AllocatorCallWriter
from ...trace.blocks import BlockTableWriter

from .block_index import BlockIndex
from .call_hooks import CallHooks

# (module, symbol, kind): what the tracker hooks; kind "free" releases a block
TRACKED = (("libc.so.6", "malloc", "malloc"), ("libc.so.6", "calloc", "calloc"),
           ("libc.so.6", "realloc", "realloc"), ("libc.so.6", "free", "free"),
           # C++: operator new / new[] (also the nothrow forms) and delete / delete[]
           ("libstdc++.so.6", "_Znwm", "new"), ("libstdc++.so.6", "_Znam", "new"),
           ("libstdc++.so.6", "_ZnwmRKSt9nothrow_t", "new"),
           ("libstdc++.so.6", "_ZnamRKSt9nothrow_t", "new"),
           ("libstdc++.so.6", "_ZdlPv", "free"), ("libstdc++.so.6", "_ZdaPv", "free"),
           ("libstdc++.so.6", "_ZdlPvm", "free"), ("libstdc++.so.6", "_ZdaPvm", "free"))


class AllocTracker:
    def __init__(self, tracee: Tracee, space: AddressSpace, sequence_of, next_order, guard=None,
                 out_dir: str = ".", code_address=None, step_fault=None):
        """``code_address(address)``: the original code's address of a return
        address (the data engine's relocated code is named by the original);
        ``step_fault``: see CallHooks."""
        self.code_address = code_address or (lambda address: address)
        self.next_order = next_order
        self.tracee = tracee
        self.space = space
        self.sequence_of = sequence_of
        self.hooks = CallHooks(tracee, "alloc", self._on_entry, self._on_return, guard, step_fault)
        self.inline = None                  # hook stubs in the target (inline_hooks.py), if any
        self.table = BlockTableWriter(out_dir)
        # when each thread was inside the allocator (its own accesses are not the program's)
        self.calls = AllocatorCallWriter(out_dir)
        self._returning: int | None = None     # the thread whose allocator call is returning
        self.live = BlockIndex()                  # live blocks: [address, end) -> id
        self.freed = BlockIndex()                 # the last block freed at each address
        self.live_mappings: dict[int, int] = {}   # address -> id of live memmap/mremap blocks
        self._sites: dict[int, int] = {}          # return address -> site code
        # held while the indexes change outside the hybrid engine's drain (which names
        # accesses with them in its own thread): the drain's lock there (data.py)
        self.lock = threading.RLock()
        self.count = 0           # blocks so far (the last id)
        self.events = 0          # allocator calls seen

    @property
    def active(self) -> bool:
        return self.hooks.active or (self.inline is not None and self.inline.active)

    @property
    def missed_windows(self) -> int:
        return self.hooks.missed_windows

    # -------------------------------------------------------------- install
    def install(self, rs: RemoteSyscalls, patched: set[int], inline=None) -> list[str]:
        """Hooks on libc's allocator: stubs in the target (``inline``: the hybrid
        engine's InlineHooks), breakpoints for what they cannot take (and without
        ``inline``); ``patched``: addresses already patched by function tracing
        (left alone). Returns warnings."""
        warnings = []
        functions = {}
        for module, symbol, kind in TRACKED:
            if not any(m.name.startswith(module) for m in self.space.modules):
                continue            # no C++ runtime in this program
            try:
                address = self.space.find_symbol(f"{module}:{symbol}").address
            except UnknownSymbolError:
                warnings.append(f"{symbol} not found in {module}: not tracked")
                continue
            if address in patched:
                warnings.append(f"{symbol} is patched for function tracing: its blocks are not named")
                continue
            functions.setdefault(address, kind)
        if inline is not None:
            self.inline = inline
            functions = inline.install(rs, {a: (kind, "alloc") for a, kind in functions.items()})
        self.hooks.install(rs, functions)
        return warnings

    def split_freed(self, freed: np.ndarray, tids: np.ndarray) -> tuple[int, int]:
        """Accesses to freed blocks (``freed``, by thread ``tids``): how many are the
        program's (use after free), how many the allocator's own bookkeeping (its
        thread inside malloc, free...)."""
        inside = self.inside_threads()
        allocator = freed & np.isin(tids, np.array(sorted(inside))) if inside else \
            np.zeros(len(freed), dtype=bool)
        mine = int(np.count_nonzero(allocator))
        return int(np.count_nonzero(freed)) - mine, mine

    def remove(self, mem=None) -> None:
        self.hooks.remove(mem)
        # calls in flight never return through the hooks now: open-ended rows
        for tid, stack in self.hooks.leftover.items():
            for entry in stack:
                self.calls.add(tid, entry[1][2], int(OPEN))
        if mem is None and self.inline is not None:
            for tid, state in self.inline.events.open_allocator_calls():
                self.calls.add(tid, state[2], int(OPEN))

    def claim_trap(self, tracee: Tracee, event: SignalStop, regs) -> bool:
        return self.hooks.claim_trap(tracee, event, regs)

    def _on_entry(self, tid: int, name: str, regs):
        # the order at the entry (the accesses before it drained: the program's)
        return self.call_entered(regs.rdi, regs.rsi, self.next_order())

    def _on_return(self, tid: int, name: str, args, regs, return_address: int) -> None:
        with self.lock:
            self._returning = tid
            try:
                end = self.next_order()     # the accesses made inside drained: the allocator's
            finally:
                self._returning = None
            self.call_returned(tid, name, args, regs.rax, return_address, end,
                               lambda: self.sequence_of(tid), self.next_order)

    # ------------------------------------------------ allocator calls, either hook
    @staticmethod
    def call_entered(a0: int, a1: int, order: int) -> tuple[int, int, int]:
        """An allocator call began (``order``: its entry's): what its return needs."""
        return a0, a1, order

    def call_returned(self, tid: int, name: str, state, result: int, return_address: int,
                      end: int, seq, next_order) -> None:
        """The call ``state`` (call_entered's) returned ``result`` at order ``end``;
        ``seq()``: the thread's call records now, ``next_order()``: the next event order."""
        self.calls.add(tid, state[2], end)
        self._record(tid, name, state[0], state[1], result, return_address, seq, next_order)

    def inside_threads(self) -> set[int]:
        """The threads inside an allocator call now (their accesses are the
        allocator's: not the program's use after free)."""
        # a copy first: the hybrid engine's drain thread asks too
        inside = {tid for tid, stack in list(self.hooks.pending.items()) if stack}
        if self.inline is not None:
            inside |= self.inline.events.inside_allocator()
        if self._returning is not None:
            inside.add(self._returning)
        return inside

    def mapped(self, tid: int, kind: str, address: int, size: int, return_address: int) -> None:
        """The program mapped memory itself (mmap, mremap: ``kind``)."""
        with self.lock:
            self.events += 1
            block_id = self._add(tid, kind, address, size, return_address, self.sequence_of(tid),
                                 self.next_order)
            self.live_mappings[address] = block_id

    def unmapped(self, tid: int, start: int, end: int) -> None:
        """munmap (or the old range of an mremap): the mapped blocks inside are released."""
        with self.lock:
            self.events += 1
            seq = self.sequence_of(tid)
            for address, _end, block_id in self.live.in_range(start, end):
                if self.live_mappings.get(address) == block_id:
                    self._release(address, tid, seq, self.next_order)

    def is_mapping(self, address: int) -> bool:
        """A live block the program mapped itself starts at ``address``."""
        return address in self.live_mappings

    # ---------------------------------------------------------------- blocks
    def _site(self, return_address: int) -> int:
        """The calling instruction as MadT names it (function+decimal offset): its code."""
        code = self._sites.get(return_address)
        if code is None:
            code = self._sites[return_address] = self.table.site_code(
                self.space.code_location(self.code_address(return_address) - 5, decimal=True))
        return code

    def _record(self, tid, name, a0, a1, result, return_address, seq_now, next_order) -> None:
        self.events += 1
        seq = seq_now()
        if name == "free":
            self._release(a0, tid, seq, next_order)
            return
        if name == "realloc" and a0:
            if result:
                self._release(a0, tid, seq, next_order)
            elif a1:
                return  # failed realloc: the old block stays
        if not result:
            return
        size = a0 * a1 if name == "calloc" else (a1 if name == "realloc" else a0)
        self._add(tid, name, result, size, return_address, seq, next_order)

    def _add(self, tid: int, kind: str, address: int, size: int, return_address: int,
             seq: int, next_order) -> int:
        site = self._site(return_address)
        # the order first: it drains the rings, and an allocation met there (another
        # thread's) takes the next id before this one ("block N out of order" before)
        order = next_order()
        self.count += 1
        block_id = self.count
        self.table.add(block_id, kind, address, size, site, tid, seq, order)
        # the address is reused: the freed block there is gone
        inner = self.live.block_added(self.freed, address, address + max(size, 1), block_id)
        if inner:       # operator new returns the block its malloc made
            self.table.set_part_of(inner, block_id)
            self.live_mappings.pop(address, None)
        return block_id

    def _release(self, address: int, tid: int, seq: int, next_order) -> None:
        block_id, _end = self.live.block_released(self.freed, address)
        if not block_id:
            return
        self.live_mappings.pop(address, None)
        self.table.release(block_id, tid, seq, next_order())

    def block_at(self, address: int) -> tuple[int, int]:
        """(id, 0) of the live block containing ``address``, else (id, 1) of the
        last freed one there; (0, 0) for none."""
        block_id = self.live.find(address)
        if block_id:
            return block_id, 0
        block_id = self.freed.find(address)
        return (block_id, 1) if block_id else (0, 0)

    def blocks_of(self, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``block_at`` for an array of addresses: (block ids, 0 or 1 freed); 0: no block."""
        ids = np.zeros(len(addresses), dtype=np.uint32)
        freed = np.zeros(len(addresses), dtype=np.uint8)
        self.blocks_into(addresses, ids, freed)
        return ids, freed

    def split_thread_freed(self, tid: int, freed: int) -> tuple[int, int]:
        """``split_freed`` for ``freed`` accesses of one thread."""
        return (0, freed) if tid in self.inside_threads() else (freed, 0)

    def blocks_into(self, addresses: np.ndarray, ids: np.ndarray, freed: np.ndarray) -> None:
        """``blocks_of`` into arrays of the caller's (uint32, uint8, as long as
        ``addresses``): the hybrid drain reuses them from batch to batch.  Through
        the indexes' caches: the drain's thread only."""
        ids[:] = 0
        freed[:] = 0
        self.live.fill(addresses, ids, freed, 0, cached=True)
        self.freed.fill(addresses, ids, freed, 1, cached=True)

    def write(self, out_dir: str | None = None) -> None:
        """Everything so far to the block table (data/blocks.bin, blocks.sites) and
        the allocator calls (data/allocator_calls.bin)."""
        self.table.flush()
        self.calls.flush()
