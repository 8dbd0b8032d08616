# SPDX-License-Identifier: GPL-2.0-or-later
"""Block events (MadT's Y, W, G): a whole range of traced memory read or
written at once, recorded as one event instead of a fault per access.

* System calls: a call whose buffers reach traced memory runs with those
  pages open (data_syscalls.py); its buffers become G (the kernel fetches:
  write, send...) or W (the kernel stores: read, recv...) events, sized by
  what the call really moved (its result).
* memcpy/memmove (Y: block copy) and memset (W: block store) of libc: under
  the hybrid engine, hook stubs in the target (inline_hooks.py) on the
  implementations the program's IFUNCs resolve to: a call whose buffers reach
  traced pages, all aliased, writes its event into the thread's ring and
  reaches them through the alias (``mem_event`` takes it, in order with the
  accesses); other calls go straight on.  What a stub cannot take (buffers on
  traced pages that are not all aliased), and every call under the fault
  engine, goes through entry and return hooks (call_hooks.py): when a call's
  ranges reach protected pages, the event is
  recorded at the entry, those pages are opened for the call and closed at
  its return; the call's own loads and stores are not recorded one by one.
  Other threads run meanwhile: their accesses to those pages in that window
  are missed and each such window is counted (``open_windows``).  The hybrid
  engine gives the call its buffers' alias instead (``redirected``), so no
  page is opened; its result is put back to the destination it was given.

Events go to data/block_events.bin (trace/block_event_records.py): order
(shared with accesses and allocations), tid, seq (call records before it),
kind, rip (the call site or system call), address, size, source (Y: where
the bytes came from), what ("read", "memcpy"...), and the heap blocks that
held the address and the source then (the allocation tracker's index, as for
an access).  Each event is appended as it comes (a small buffer, never the
whole list in memory); ``write`` flushes it: the file is complete as of then.
"""

from __future__ import annotations

import struct
from collections import Counter

import numpy as np

from ..process.remote_syscall import RemoteSyscalls
from ..trace.block_event_records import KIND_CODES, BlockEventWriter
from ..trace.format import (BLOCK_EVENT_DTYPE, BLOCK_EVENT_FREED, BLOCK_EVENT_HAS_SOURCE,
                            BLOCK_EVENT_SOURCE_FREED, BLOCK_EVENT_WHATS, PAGE)
from .heap.call_hooks import CallHooks
from .open_window import open_window

# system call -> (kind, ((pointer arg, length arg), ...) | ("iovec", arg, count arg) |
#                 ("msghdr", arg))
SYSCALL_BUFFERS = {
    0: ("W", "read", ((1, 2),)), 1: ("G", "write", ((1, 2),)),
    17: ("W", "pread64", ((1, 2),)), 18: ("G", "pwrite64", ((1, 2),)),
    44: ("G", "sendto", ((1, 2),)), 45: ("W", "recvfrom", ((1, 2),)),
    318: ("W", "getrandom", ((0, 1),)), 217: ("W", "getdents64", ((1, 2),)),
    19: ("W", "readv", "iovec"), 20: ("G", "writev", "iovec"),
    295: ("W", "preadv", "iovec"), 296: ("G", "pwritev", "iovec"),
    327: ("W", "preadv2", "iovec"), 328: ("G", "pwritev2", "iovec"),
    46: ("G", "sendmsg", "msghdr"), 47: ("W", "recvmsg", "msghdr"),
}
MEM_FUNCTIONS = (("memcpy", "Y"), ("memmove", "Y"), ("memset", "W"))
# every name an event can have has its code in the record format
assert {n for _, n, _ in SYSCALL_BUFFERS.values()} | {n for n, _ in MEM_FUNCTIONS} <= \
    set(BLOCK_EVENT_WHATS)
MAX_IOV = 1024


def syscall_ranges(nr: int, args: list[int], read_memory) -> tuple[str, str, list] | None:
    """(kind, name, [(address, length)...]) of the buffers a call moves, in order."""
    spec = SYSCALL_BUFFERS.get(nr)
    if spec is None:
        return None
    kind, name, how = spec
    if how == "iovec":
        vec, count = args[1], min(args[2], MAX_IOV)
    elif how == "msghdr":
        try:
            vec, count = struct.unpack("<QQ", read_memory(args[1] + 16, 16))
        except Exception:
            return None
        count = min(count, MAX_IOV)
    else:
        return kind, name, [(args[p], args[n]) for p, n in how]
    try:
        raw = read_memory(vec, 16 * count) if count else b""
    except Exception:
        return None
    return kind, name, list(struct.iter_unpack("<QQ", raw))


class BlockEvents:
    def __init__(self, engine):
        self.engine = engine
        self.totals: dict = {}               # kind -> {"events", "bytes"}
        self._writer: BlockEventWriter | None = None   # data/block_events.bin, at the first event
        self.hooks: CallHooks | None = None
        self.inline = None         # the hybrid engine's hook stubs (inline_hooks.py)
        self._calls: dict[int, int] = {}    # return address -> the call (its original)
        self.open_windows = 0
        self.window_pages: Counter = Counter()   # page -> windows it was open in
        self.redirected = 0        # memcpy/memset calls made through the alias (hybrid)
        self._open: dict[int, list] = {}    # tid -> pages opened for its mem* call

    # ---------------------------------------------------------------- record
    def record(self, tid: int, kind: str, what: str, rip: int, address: int, size: int,
               source: int | None = None, seq=None, order=None) -> None:
        """``seq()``, ``order()``: the event's (default: now, every record drained)."""
        engine = self.engine
        if size <= 0 or not engine.recording(tid) or (
                engine.regions.find(address) is None and
                (source is None or engine.regions.find(source) is None)):
            return
        order = (order or engine.next_order)()
        alloc = engine.alloc if engine.alloc is not None and engine.alloc.active else None
        block = alloc.block_at(address) if alloc is not None else (0, 0)
        source_block = alloc.block_at(source) if alloc is not None and source is not None \
            else (0, 0)
        if self._writer is None:
            self._writer = BlockEventWriter(engine.out_dir)
        self._writer.add(tid, kind, what, order, (seq or engine.sequence_of)(tid), rip, address,
                         size, source, block, source_block)
        entry = self.totals.setdefault(kind, {"events": 0, "bytes": 0})
        entry["events"] += 1
        entry["bytes"] += size

    def syscall_done(self, tid: int, nr: int, ranges, rip: int, result: int) -> None:
        """A call that moved ``result`` bytes through ``ranges`` (in order)."""
        if ranges is None or result <= 0 or result >= 1 << 63:
            return
        kind, name, buffers = ranges
        left = result
        for address, length in buffers:
            if left <= 0:
                break
            moved = min(length, left)
            self.record(tid, kind, name, rip, address, moved)
            left -= moved

    # ------------------------------------------------------ memcpy & memset
    def install(self, rs: RemoteSyscalls, patched: set[int], inline=None) -> list[str]:
        """Hooks on libc's memcpy/memmove/memset implementations: stubs in the
        target (``inline``: the hybrid engine's InlineHooks), breakpoints for what
        they cannot take (and without ``inline``)."""
        warnings = []
        functions: dict[int, str] = {}
        space = self.engine.space
        for name, kind in MEM_FUNCTIONS:
            # the default version is the IFUNC (memcpy@GLIBC_2.2.5 is an old plain one)
            found = sorted(space.find_functions(f"libc.so.6:{name}"),
                           key=lambda s: s.symbol.kind != "IFUNC")
            if not found:
                continue
            symbol = found[0]
            address = symbol.address
            if symbol.symbol.kind == "IFUNC":
                address = rs.call_function(address)   # the implementation it resolves to
            if address in patched:
                warnings.append(f"{name} is patched for function tracing: its calls are "
                                "traced access by access")
                continue
            functions.setdefault(address, name)
        if inline is not None:
            self.inline = inline
            functions = inline.install(rs, {a: (name, "mem") for a, name in functions.items()},
                                       slow=(self._on_entry, self._on_return))
        if functions:
            self.hooks = CallHooks(self.engine.tracee, "blocks", self._on_entry, self._on_return,
                                   self.engine.guard, self.engine.step_fault)
            self.hooks.install(rs, functions)
        return warnings

    def claim_trap(self, tracee, event, regs) -> bool:
        """A SIGTRAP stop: a breakpoint of these hooks, or a hook stub's trap."""
        return (self.hooks is not None and self.hooks.claim_trap(tracee, event, regs)) or \
            (self.inline is not None and self.inline.claim_trap(tracee, event, regs))

    def mem_event(self, tid: int, name: str, dst: int, src: int, n: int, return_address: int,
                  seq, order) -> None:
        """A hook stub's memcpy/memmove/memset on traced pages, made through the alias
        (``seq()``, ``order()``: the event's, hook_events.py)."""
        rip = self._call_site(return_address)
        if name == "memset":
            self.record(tid, "W", name, rip, dst, n, seq=lambda _tid: seq(), order=order)
        else:
            self.record(tid, "Y", name, rip, dst, n, source=src, seq=lambda _tid: seq(),
                        order=order)
        self.redirected += 1

    def _call_site(self, return_address: int) -> int:
        """The call (in the original code) of a hook stub's call returning there."""
        rip = self._calls.get(return_address)
        if rip is None:
            rip = self._calls[return_address] = self.engine.code_address(return_address) - 5
        return rip

    def mem_recorded(self, tid: int, dst: np.ndarray, src: np.ndarray, n: np.ndarray,
                     copies: np.ndarray) -> np.ndarray:
        """Which of many hook stubs' memcpy/memmove (``copies``) and memset calls
        ``record`` makes an event of (the others take no order)."""
        if not self.engine.recording(tid):
            return np.zeros(len(dst), dtype=bool)
        regions = self.engine.regions
        return (n > 0) & (regions.mask(dst) | (copies & regions.mask(src)))

    def mem_events(self, tid: int, whats: np.ndarray, copies: np.ndarray, dst: np.ndarray,
                   src: np.ndarray, n: np.ndarray, returns: np.ndarray, seqs: np.ndarray,
                   orders: np.ndarray) -> None:
        """``mem_event``'s records for many calls of one thread at once (those
        ``mem_recorded`` chose, with their orders), written together (the caller
        counts them in ``redirected``); ``whats``: their functions' codes (memcpy, memmove, memset),
        ``copies``: which copy (the others set)."""
        if not len(dst):
            return
        engine = self.engine
        rips = np.array([self._call_site(a) for a in returns.tolist()], dtype=np.uint64)
        rows = np.zeros(len(dst), dtype=BLOCK_EVENT_DTYPE)
        rows["order"], rows["seq"], rows["rip"] = orders, seqs, rips
        rows["address"], rows["size"], rows["tid"] = dst, n, tid
        rows["source"] = np.where(copies, src, 0)
        rows["kind"] = np.where(copies, KIND_CODES["Y"], KIND_CODES["W"])
        rows["what"] = whats
        flags = np.where(copies, BLOCK_EVENT_HAS_SOURCE, 0)
        alloc = engine.alloc if engine.alloc is not None and engine.alloc.active else None
        if alloc is not None:
            block, freed = alloc.blocks_of(np.ascontiguousarray(dst, dtype=np.uint64))
            rows["block"] = block
            flags |= np.where(freed != 0, BLOCK_EVENT_FREED, 0)
            block, freed = alloc.blocks_of(np.ascontiguousarray(src, dtype=np.uint64))
            rows["source_block"] = np.where(copies, block, 0)
            flags |= np.where(copies & (freed != 0), BLOCK_EVENT_SOURCE_FREED, 0)
        rows["flags"] = flags
        if self._writer is None:
            self._writer = BlockEventWriter(engine.out_dir)
        self._writer.add_rows(rows)
        for kind, chosen in (("Y", copies), ("W", ~copies)):
            count = int(chosen.sum())
            if count:
                entry = self.totals.setdefault(kind, {"events": 0, "bytes": 0})
                entry["events"] += count
                entry["bytes"] += int(n[chosen].sum())

    def _pages(self, address: int, size: int) -> set[int]:
        if size <= 0:
            return set()
        size = min(size, 1 << 34)
        return {p for p in range(address & ~(PAGE - 1), address + size, PAGE)
                if self.engine.is_protected(p)}

    def _on_entry(self, tid: int, name: str, regs):
        dst, n = regs.rdi, regs.rdx
        src = regs.rsi if name != "memset" else None
        pages = self._pages(dst, n) | (self._pages(src, n) if src is not None else set())
        if not pages:
            return None
        rip = self.engine.code_address(self.engine.tracee.mem.read_u64(regs.rsp)) - 5   # the call
        if name == "memset":
            self.record(tid, "W", name, rip, dst, n)
        else:
            self.record(tid, "Y", name, rip, dst, n, source=src)
        engine = self.engine
        if self._through_alias(regs, dst, src, n):
            return dst
        open_window(engine, tid, pages, self._open)
        if len(engine.tracee.threads) > 1:
            self.open_windows += 1
            self.window_pages.update(pages)
        return pages

    def _through_alias(self, regs, dst: int, src: int | None, n: int) -> bool:
        """Hybrid engine: the call's traced buffers reached through their alias (its
        pointer arguments changed until it returns), so that no page is opened
        while other threads run; False when a buffer is not wholly aliased."""
        alias = self.engine.alias
        if alias is None or not alias.active:
            return False
        changes = {}
        for register, pointer in (("rdi", dst), ("rsi", src)):
            if pointer is not None and self._pages(pointer, n):
                if not alias.usable(pointer, pointer + min(n, 1 << 34)):
                    return False
                changes[register] = alias.image(pointer)
        for register, value in changes.items():
            setattr(regs, register, value)
        self.redirected += 1
        return True

    def _on_return(self, tid: int, name: str, pages, regs, return_address: int) -> None:
        if isinstance(pages, int):
            regs.rax = pages       # through the alias: it returns its destination, as given
        elif pages:
            self._open.pop(tid, None)
            with RemoteSyscalls(self.engine.tracee, tid) as rs:
                self.engine.protect(rs, pages)

    def held_open(self) -> set[int]:
        """Pages open for a thread's running memcpy/memmove/memset."""
        return set().union(*self._open.values())

    # ---------------------------------------------------------------- results
    def counts(self) -> dict:
        return {kind: dict(entry) for kind, entry in self.totals.items()}

    def write(self, out_dir: str) -> None:
        """data/block_events.bin complete as of now (an empty file when none came)."""
        if self._writer is None:
            self._writer = BlockEventWriter(out_dir)
        self._writer.flush()
