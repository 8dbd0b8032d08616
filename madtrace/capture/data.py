"""The data access engine (MadT): page protections and the fault loop.

Traced pages (``regions``) are mprotect()ed to PROT_NONE inside the target.
Each access faults (SIGSEGV, SEGV_ACCERR at a protected page); the tracer
decodes the instruction (cached by address), computes the effective address
of every memory operand from the thread's registers, records those that fall
in a traced range, opens the pages the instruction touches, single-steps it,
and protects the pages again.  A fault anywhere else is the target's own and
is delivered unchanged.

System calls never fault on protected pages: the kernel returns EFAULT
(pitfall 4).  So threads run under PTRACE_SYSCALL; at the entry of a call
that may touch user memory the call is skipped and rewound, the pages are
opened, the call runs for real, and the pages are closed at its exit.  brk
growth extends the heap region.  A fork child gets its original protections
back before it runs; a vfork shares the pages, so they stay open until the
parent resumes.

Threads: while pages are open for one thread's instruction, the other
threads are held stopped (``exact_threads``), so no access is missed.  A
system call runs with the pages open while the other threads run (it may
block on them): their accesses in that window are not seen, and each such
window is counted in ``open_windows``.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections import Counter

import numpy as np

from ..arch.x86_64.memops import MemInstruction, effective_address, memory_accesses
from ..binary.address_space import AddressSpace
from ..binary.maps import read_maps
from ..errors import UsageError
from ..process import ptrace_raw as pr
from ..process.events import SignalStop, SyscallStop
from ..process.remote_syscall import PROT_NONE, RemoteSyscalls
from ..process.tracee import Tracee
from .alloc import AllocTracker
from .datastubs import StubCache
from .syscall_memory import syscall_pages
from .regions import PAGE, Region, RegionSet, default_regions, page_protections, page_runs

SEGV_ACCERR = 2
SYS_BRK = 12
# system calls that never read or write user memory through a pointer
SAFE_SYSCALLS = frozenset({
    3, 8, 9, 10, 11, 12, 24, 32, 33, 34, 39, 60, 62, 102, 104, 107, 108, 110, 186, 200,
    231, 234, 292,
})
# one data access (data/<tid>.acc): seq = call records the thread had written before it;
# order = the tracer's event counter, shared with allocation events (a total order of
# what the tracer saw); block = allocation id (0: none), freed = it was already freed;
# first = the first access of one execution of the instruction
ACCESS_DTYPE = np.dtype([("seq", "<u8"), ("order", "<u8"), ("rip", "<u8"), ("addr", "<u8"),
                         ("block", "<u4"), ("size", "<u2"), ("kind", "u1"), ("freed", "u1"),
                         ("ilen", "u1"), ("first", "u1"), ("pad", "u1", 6)])
ACCESS_FIELDS = ("seq", "order", "rip", "addr", "block", "size", "kind", "freed", "ilen", "first")
KIND_LOAD, KIND_STORE = 1, 2
PTRACE_GET_SYSCALL_INFO = 0x420E


class _SyscallInfo(ctypes.Structure):
    _fields_ = [("op", ctypes.c_uint8), ("pad", ctypes.c_uint8 * 3), ("arch", ctypes.c_uint32),
                ("instruction_pointer", ctypes.c_uint64), ("stack_pointer", ctypes.c_uint64),
                ("nr", ctypes.c_uint64), ("args", ctypes.c_uint64 * 6)]


def syscall_op(tid: int) -> tuple[int, int, list[int]]:
    """(1 entry | 2 exit, the syscall number at entry / the result at exit, the
    arguments at entry)."""
    info = _SyscallInfo()
    pr.ptrace(PTRACE_GET_SYSCALL_INFO, tid, ctypes.sizeof(info),
              ctypes.cast(ctypes.byref(info), ctypes.c_void_p))
    return info.op, info.nr, list(info.args)


class DataEngine:
    def __init__(self, tracee: Tracee, space: AddressSpace, out_dir: str,
                 sequence_of=None, fast_path: bool = True, track_allocations: bool = True,
                 patched_addresses: set[int] | None = None, exact_threads: bool = True,
                 defer=None, only_regions: list[Region] | None = None, region_filter=None):
        """``only_regions``: trace exactly these ranges (a watched variable);
        ``region_filter``: keep the default regions it accepts (--regions)."""
        self.only_regions = only_regions
        self.region_filter = region_filter
        self.exact_threads = exact_threads
        self.defer = defer or (lambda events: None)
        self.fast_path = fast_path
        self.track_allocations = track_allocations
        self.patched_addresses = patched_addresses or set()
        self.warnings: list[str] = []
        self.tracee = tracee
        self.space = space
        self.out_dir = out_dir
        self.sequence_of = sequence_of or (lambda tid: 0)   # position in the thread's call records
        self.regions = RegionSet([])
        self.protected: dict[int, int] = {}   # page -> original PROT_* bits
        self.decoded: dict[int, MemInstruction | None] = {}
        self.counts: Counter = Counter()      # (rip, "L"/"S") -> n
        self.buffers: dict[int, list] = {}    # tid -> [(seq, rip, addr, size, kind)]
        self.faults = 0
        self.untraced_faults = 0
        self.open_windows = 0
        self.syscalls_opened = 0
        self._syscall_open: dict[int, set] = {}   # tid -> pages open for its running syscall
        self._skipping: dict[int, tuple] = {}   # tid -> (registers at entry, pages to open)
        self._entry_nr: dict[int, int] = {}      # tid -> number of the syscall it is in
        self.active = False
        self.stubs: StubCache | None = None
        self.fast = 0            # accesses handled by a stub (one stop)
        self.alloc: AllocTracker | None = None
        self._held: set[int] | None = None   # threads stopped while one thread's pages are open
        self.held_stops = 0
        self.freed_accesses = 0  # accesses to blocks already freed (use after free)
        self.order = 0           # event counter shared with the allocation tracker
        self.released: set[int] = set()   # pages given back when tracing stopped

    # ---------------------------------------------------------------- install
    def install(self) -> None:
        mappings = read_maps(self.tracee.pid)
        if self.only_regions is not None:
            regions = list(self.only_regions)
        else:
            regions = [r for r in default_regions(self.space, mappings)
                       if self.region_filter is None or self.region_filter(r)]
        if not regions:
            raise UsageError("no data region to trace")
        self.regions = RegionSet(regions)
        pages = self.regions.pages()
        self.protected = page_protections(mappings, pages)
        with RemoteSyscalls(self.tracee) as rs:
            self._protect(rs, self.protected)
            if self.fast_path:
                self.stubs = StubCache(self.tracee, self.space, rs)
            if self.track_allocations:
                self.alloc = AllocTracker(self.tracee, self.space, self.sequence_of, self._next_order)
                self.warnings += self.alloc.install(rs, self.patched_addresses)
        self.tracee.trace_syscalls = True
        self.active = True

    def _protect(self, rs: RemoteSyscalls, pages) -> None:
        for start, end in page_runs(pages):
            rs.mprotect(start, end - start, PROT_NONE)

    def _unprotect(self, rs: RemoteSyscalls, pages) -> None:
        by_prot: dict[int, list[int]] = {}
        for page in pages:
            by_prot.setdefault(self.protected[page], []).append(page)
        for prot, group in by_prot.items():
            for start, end in page_runs(group):
                rs.mprotect(start, end - start, prot)

    # ------------------------------------------------------------------ faults
    def claim_signal(self, tracee: Tracee, event: SignalStop) -> bool:
        if tracee is not self.tracee:
            return False
        if event.signum == signal.SIGTRAP:
            return self._claim_trap(tracee, event)
        if not self.active:
            # a fault taken just before tracing stopped, reported after: the page is
            # open again, so the instruction simply runs when the thread resumes
            if event.signum == signal.SIGSEGV and event.si_code == SEGV_ACCERR \
                    and event.si_addr & ~(PAGE - 1) in self.released:
                tracee.resume(event.tid, 0)
                return True
            return False
        if event.signum != signal.SIGSEGV:
            return False
        tid = event.tid
        page = event.si_addr & ~(PAGE - 1)
        if event.si_code != SEGV_ACCERR or page not in self.protected:
            return False  # the target's own fault: delivered unchanged
        regs = self.tracee.get_regs(tid)
        self._hold_others(tid)
        if self.stubs is not None and self.stubs.contains(regs.rip):
            # the relocated instruction touched a page its stub does not open (its
            # accesses were recorded at the first fault): open it for this one step,
            # then let the stub finish (other threads stay held until its int3)
            self._single_step(tid, {page})
            pr.cont(tid, 0)
            tracee.threads[tid].running = True
            return True
        else:
            pages = self._record(tid, regs, {page})
            # stubs run unsupervised, so only while no other thread could run meanwhile;
            # with threads, the window (others held, step, close) stays inside this call
            single = len(self.tracee.threads) == 1
            stub = self.stubs.stub_for(self._decode(regs.rip), pages, self.protected) \
                if self.stubs is not None and single else None
            if stub is not None:
                regs.rip = stub
                self.tracee.set_regs(regs, tid)
                self.fast += 1
                pr.cont(tid, 0)   # no syscall stops for the stub's mprotect calls
                tracee.threads[tid].running = True
                return True
            self._single_step(tid, pages)
        self._release_others()
        tracee.resume(tid, 0)
        return True

    # threads: while pages are open for one thread's instruction, the others must not
    # run, or their accesses to those pages would go unseen
    def _next_order(self) -> int:
        self.order += 1
        return self.order

    def _hold_others(self, tid: int) -> None:
        if not self.exact_threads or len(self.tracee.threads) < 2:
            return
        running = {t for t, s in self.tracee.threads.items() if s.running and t != tid}
        if not running:
            return
        events = self.tracee.stop_all()
        self.defer(events)
        self._held = (self._held or set()) | (running - {e.tid for e in events})
        self.held_stops += 1

    def _release_others(self) -> None:
        held, self._held = self._held, None
        for t in held or ():
            state = self.tracee.threads.get(t)
            if state is not None and not state.running:
                self.tracee.resume(t)

    def _claim_trap(self, tracee: Tracee, event: SignalStop) -> bool:
        """SIGTRAPs of ours: the end of a stub, the allocation tracker's
        breakpoints; and those reported just after tracing stopped."""
        regs = tracee.get_regs(event.tid)
        if self.active and self.stubs is not None and regs.rip in self.stubs.traps:
            self._release_others()
            tracee.resume(event.tid, 0)   # end of a stub: on to the jmp back, syscalls traced
            return True
        if self.alloc is not None and self.alloc.claim_trap(tracee, event, regs):
            return True
        if not self.active and self.stubs is not None and event.tid in self.stubs.moved:
            self.stubs.moved.discard(event.tid)   # the int3 of a stub it was moved out of
            tracee.resume(event.tid, 0)
            return True
        return False

    def _decode(self, rip: int) -> MemInstruction | None:
        if rip not in self.decoded:
            self.decoded[rip] = memory_accesses(self.tracee.mem.read(rip, 16), rip)
        return self.decoded[rip]

    def _record(self, tid: int, regs, pages: set[int]) -> set[int]:
        """Record the accesses of the instruction at rip; returns the protected pages
        it touches."""
        self.faults += 1
        insn = self._decode(regs.rip)
        recorded = False
        if insn is not None:
            seq = self.sequence_of(tid)
            buf = self.buffers.setdefault(tid, [])
            first = 1
            for op in insn.operands:
                address = effective_address(op, regs, insn)
                for page in range(address & ~(PAGE - 1), address + op.size, PAGE):
                    if page in self.protected:
                        pages.add(page)
                if self.regions.find(address) is None:
                    continue
                recorded = True
                block = self.alloc.block_at(address) if self.alloc is not None else None
                block_id, freed = (block.id, int(block.freed_seq is not None)) if block else (0, 0)
                if freed:
                    self.freed_accesses += 1
                # a read-modify-write operand is one load, then one store
                for wanted, letter, kind in ((op.load, "L", KIND_LOAD), (op.store, "S", KIND_STORE)):
                    if wanted:
                        self.counts[(regs.rip, letter)] += 1
                        self.order += 1
                        buf.append((seq, self.order, regs.rip, address, block_id, op.size, kind,
                                    freed, insn.size, first))
                        first = 0
        if not recorded:
            self.untraced_faults += 1
        if len(self.tracee.threads) > 1 and not self.exact_threads:
            self.open_windows += 1
        return pages

    def _single_step(self, tid: int, pages: set[int]) -> None:
        """Slow path: open the pages, single-step the instruction, close them."""
        opened: set[int] = set()
        state = self.tracee.threads[tid]
        while True:
            new = pages - opened
            if new:
                with RemoteSyscalls(self.tracee, tid) as rs:
                    self._unprotect(rs, new)
                opened |= new
            pr.singlestep(tid, 0)
            state.running = True
            event = self.tracee.wait_event(block=True, tid=tid)
            if isinstance(event, SignalStop) and event.signum == signal.SIGTRAP:
                break
            if isinstance(event, SignalStop) and event.signum == signal.SIGSEGV:
                page = event.si_addr & ~(PAGE - 1)
                if event.si_code == SEGV_ACCERR and page in self.protected and page not in opened:
                    pages.add(page)  # a page the decoder did not predict: open it too
                    continue
                state.pending_signal = event.signum  # a genuine fault of the target
                break
            if isinstance(event, SignalStop):
                state.pending_signal = event.signum  # delivered when it resumes
                continue
            break
        if opened and tid in self.tracee.threads:
            with RemoteSyscalls(self.tracee, tid) as rs:
                self._protect(rs, opened)

    # ---------------------------------------------------------------- syscalls
    def claim_syscall(self, tracee: Tracee, event: SyscallStop) -> bool:
        if tracee is not self.tracee:
            return False
        tid = event.tid
        if not self.active:
            if tid in self._skipping:
                # skipped just before tracing stopped: put the call back so that it
                # runs for real (every page is open now)
                saved, _pages = self._skipping.pop(tid)
                saved.rax, saved.rip, saved.orig_rax = saved.orig_rax, saved.rip - 2, 0xFFFFFFFFFFFFFFFF
                tracee.set_regs(saved, tid)
                tracee.resume(tid, 0)
                return True
            return False
        op, nr, args = syscall_op(tid)
        if op == 1:  # entry (at exit the kernel reports the result, not the number)
            self._entry_nr[tid] = nr
            if tid in self._syscall_open or nr in SAFE_SYSCALLS:
                tracee.resume(tid, 0)
                return True
            if tid in self._skipping:
                return False
            pages = syscall_pages(nr, args, self.protected, self.tracee.mem.read)
            pages = set(self.protected) if pages is None else pages
            if not pages:
                tracee.resume(tid, 0)   # touches no traced page: runs as it is
                return True
            # skip this attempt (orig_rax = -1), rewind at its exit, open, run it again
            regs = tracee.get_regs(tid)
            self._skipping[tid] = (regs.copy(), pages)
            regs.orig_rax = 0xFFFFFFFFFFFFFFFF
            tracee.set_regs(regs, tid)
            tracee.resume(tid, 0)
            return True
        if op == 2:
            if tid in self._skipping:
                saved, pages = self._skipping.pop(tid)
                saved.rax = saved.orig_rax
                saved.rip -= 2          # back onto the syscall instruction
                saved.orig_rax = 0xFFFFFFFFFFFFFFFF
                tracee.set_regs(saved, tid)
                with RemoteSyscalls(tracee, tid) as rs:
                    self._unprotect(rs, pages)
                self._syscall_open[tid] = pages
                self.syscalls_opened += 1
                if len(tracee.threads) > 1:
                    self.open_windows += 1   # other threads run while the call has the pages
                tracee.resume(tid, 0)
                return True
            opened = self._syscall_open.pop(tid, None)
            if opened is not None or self._entry_nr.pop(tid, None) == SYS_BRK:
                with RemoteSyscalls(tracee, tid) as rs:
                    if opened is not None:
                        self._protect(rs, [p for p in opened if p in self.protected])
                    self._refresh_heap(rs)
            tracee.resume(tid, 0)
            return True
        return False

    def _refresh_heap(self, rs: RemoteSyscalls) -> None:
        if self.only_regions is not None or (
                self.region_filter is not None and not self.region_filter(Region(0, 0, "[heap]"))):
            return  # the heap is not among the traced regions
        # our own mprotect calls split the heap into several mappings, all named [heap]
        parts = [m for m in read_maps(self.tracee.pid) if m.path == "[heap]"]
        heap = Region(min(m.start for m in parts), max(m.end for m in parts), "[heap]") if parts else None
        self.regions.replace("[heap]", heap)
        wanted = self.regions.pages()
        new = {p: 3 for p in wanted if p not in self.protected}
        gone = [p for p in self.protected if p not in wanted]
        for p in gone:
            del self.protected[p]
        if new:
            self.protected.update(new)
            self._protect(rs, new)

    # ------------------------------------------------------- forks and leaving
    def fork_child(self, child: Tracee) -> None:
        if self.alloc is not None and self.alloc.active:
            self.alloc.remove(child.mem)
        if self.active and self.protected:
            with RemoteSyscalls(child) as rs:
                self._unprotect(rs, self.protected)

    def detach(self) -> None:
        """Restore every page's protection (all threads stopped)."""
        if not self.active:
            return
        if self.stubs is not None:
            # a thread inside a stub would close its pages after we restored them
            for tid in list(self.tracee.threads):
                self.stubs.leave(tid)
        if self.alloc is not None and self.alloc.active:
            self.alloc.remove()
        self.active = False
        self.tracee.trace_syscalls = False
        if self.tracee.threads and self.protected:
            with RemoteSyscalls(self.tracee) as rs:
                self._unprotect(rs, self.protected)
        self.released = set(self.protected)

    def forget_after_exec(self) -> None:
        if self.alloc is not None:
            self.alloc.active = False
        self.active = False
        self.tracee.trace_syscalls = False
        self.protected.clear()

    # ----------------------------------------------------------------- results
    def write(self) -> None:
        os.makedirs(os.path.join(self.out_dir, "data"), exist_ok=True)
        if self.alloc is not None:
            self.alloc.write(self.out_dir)
        for tid, rows in self.buffers.items():
            arr = np.zeros(len(rows), dtype=ACCESS_DTYPE)
            if rows:
                for field, column in zip(ACCESS_FIELDS, zip(*rows)):
                    arr[field] = column
            arr.tofile(os.path.join(self.out_dir, "data", f"{tid}.acc"))

    def access_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (rip, kind), n in self.counts.items():
            entry = out.setdefault(self.instruction_name(rip), {"L": 0, "S": 0})
            entry[kind] += n
        return out

    def instruction_name(self, rip: int) -> str:
        """``func+0xoff`` of an instruction (``module+0xoff`` without a symbol)."""
        return self.space.code_location(rip)
