"""The allocation tracker (MadT's dynamic memory tracker).

malloc, calloc, realloc and free of libc are tracked with entry and return
hooks (call_hooks.py): the arguments at the entry, the result at the return.  Each block gets MadT's forged name: allocator, a
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
from dataclasses import asdict, dataclass

import numpy as np

from ..binary.address_space import AddressSpace
from ..errors import UnknownSymbolError
from ..process.events import SignalStop
from ..process.remote_syscall import RemoteSyscalls
from ..process.tracee import Tracee

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
MAPPING_KINDS = ("memmap", "mremap")     # blocks the program mapped itself (mmap, mremap)


@dataclass
class Block:
    id: int
    kind: str            # malloc / calloc / realloc / new / memmap / mremap
    address: int
    size: int
    site: str            # caller function+offset (decimal, as MadT)
    tid: int
    seq: int
    order: int           # position among all events the tracer saw (accesses included)
    freed_seq: int | None = None
    freed_tid: int | None = None
    freed_order: int | None = None
    part_of: int | None = None   # operator new's block made of this malloc block (same bytes)

    @property
    def name(self) -> str:
        if self.freed_seq is None:
            prefix = f"<{self.kind}"
        else:
            prefix = "<unmap:" if self.kind in MAPPING_KINDS else "<freed:"
        return f"{prefix}{self.id:04d}@{self.site}>"


class AllocTracker:
    def __init__(self, tracee: Tracee, space: AddressSpace, sequence_of, next_order, guard=None,
                 code_address=None):
        """``code_address(address)``: the original code's address of a return
        address (the data engine's relocated code is named by the original)."""
        self.code_address = code_address or (lambda address: address)
        self.next_order = next_order
        self.tracee = tracee
        self.space = space
        self.sequence_of = sequence_of
        self.hooks = CallHooks(tracee, "alloc", self._on_entry, self._on_return, guard)
        self.blocks: list[Block] = []
        self.live_starts: list[int] = []          # sorted addresses of live blocks
        self.live: dict[int, Block] = {}
        self.freed: dict[int, Block] = {}         # address -> last freed block there
        self.freed_starts: list[int] = []
        self.events = 0          # allocator calls seen (also the version of _arrays)
        self._arrays = None      # (events, numpy tables for blocks_of)

    @property
    def active(self) -> bool:
        return self.hooks.active

    @property
    def missed_windows(self) -> int:
        return self.hooks.missed_windows

    # -------------------------------------------------------------- install
    def install(self, rs: RemoteSyscalls, patched: set[int]) -> list[str]:
        """Breakpoints on libc's allocator; ``patched``: addresses already patched
        by function tracing (left alone). Returns warnings."""
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
        self.hooks.install(rs, functions)
        return warnings

    def remove(self, mem=None) -> None:
        self.hooks.remove(mem)

    def claim_trap(self, tracee: Tracee, event: SignalStop, regs) -> bool:
        return self.hooks.claim_trap(tracee, event, regs)

    def _on_entry(self, tid: int, name: str, regs):
        return regs.rdi, regs.rsi

    def _on_return(self, tid: int, name: str, args, regs, return_address: int) -> None:
        self._record(tid, name, args[0], args[1], regs.rax, return_address)

    def mapped(self, tid: int, kind: str, address: int, size: int, return_address: int) -> None:
        """The program mapped memory itself (mmap, mremap: ``kind``)."""
        self.events += 1
        self._add(Block(len(self.blocks) + 1, kind, address, size, self._site(return_address), tid,
                        self.sequence_of(tid), self.next_order()))

    def unmapped(self, tid: int, start: int, end: int) -> None:
        """munmap (or the old range of an mremap): the mapped blocks inside are released."""
        self.events += 1
        seq = self.sequence_of(tid)
        for address in [a for a in self.live_starts if start <= a < end]:
            if self.live[address].kind in MAPPING_KINDS:
                self._release(address, tid, seq)

    # ---------------------------------------------------------------- blocks
    def _site(self, return_address: int) -> str:
        """The calling instruction as MadT names it: function+decimal offset."""
        return self.space.code_location(self.code_address(return_address) - 5, decimal=True)

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
        self._add(Block(len(self.blocks) + 1, name, result, size, self._site(return_address), tid,
                        seq, self.next_order()))

    def _add(self, block: Block) -> None:
        result = block.address
        self.blocks.append(block)
        inner = self.live.get(result)
        if inner is not None:      # operator new returns the block its malloc made
            inner.part_of = block.id
            del self.live[result]
            del self.live_starts[bisect.bisect_left(self.live_starts, result)]
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
        for flag, (starts, ends, block_ids) in enumerate(self.tables()):
            if not len(starts):
                continue
            i = np.searchsorted(starts, addresses, side="right") - 1
            j = np.maximum(i, 0)
            hit = (i >= 0) & (ids == 0) & (addresses < ends[j])
            ids[hit] = block_ids[j[hit]]
            freed[hit] = flag
        return ids, freed

    def tables(self):
        """(starts, ends, ids) of the live blocks and of the freed ones (the last
        freed at each address), sorted by start (numpy; rebuilt after a change)."""
        if self._arrays is None or self._arrays[0] != self.events:
            tables = []
            for starts, table in ((self.live_starts, self.live), (self.freed_starts, self.freed)):
                blocks = [table[a] for a in starts]
                tables.append((np.array(starts, dtype=np.uint64),
                               np.array([b.address + max(b.size, 1) for b in blocks], dtype=np.uint64),
                               np.array([b.id for b in blocks], dtype=np.uint32)))
            self._arrays = (self.events, tables)
        return self._arrays[1]

    def write(self, out_dir: str) -> None:
        os.makedirs(os.path.join(out_dir, "data"), exist_ok=True)
        with open(os.path.join(out_dir, "data", "allocations.json"), "w") as f:
            json.dump([dict(asdict(b), name=b.name) for b in self.blocks], f)
