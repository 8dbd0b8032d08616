"""The data access engine (MadT): page protections and the fault loop.

Traced pages (``regions``) are mprotect()ed to PROT_NONE inside the target.
Each access faults (SIGSEGV, SEGV_ACCERR at a protected page).  A fault
anywhere else is the target's own and is delivered unchanged.

Fast path, one ptrace stop per access (datastubs.py, process/fault_loop.c):
the first fault of an instruction is decoded here (capstone, cached by
address) and the instruction gets a stub per data slot: itself re-encoded
with its memory operand redirected to the slot.  At each fault of it the C
loop computes the effective address from the registers, copies the
operand's bytes into the thread's slot, records the access and points the
thread at the stub; the page is never opened.  A store is written back from
the slot at the tracer's next stop, before anything else can observe the
location: every access to the page faults first, every system call stops
first.  Threads need no holding: nothing is ever open.

Slow path (string instructions, control transfers through memory, locked
instructions while several threads run, anything the re-encoder refuses):
the accesses are recorded, the pages the instruction touches are opened, the
instruction is single-stepped with the other threads held, and the pages are
closed again.

System calls never fault on protected pages: the kernel returns EFAULT
(pitfall 4).  Threads run under PTRACE_SYSCALL; data_syscalls.py opens the
pages a call's arguments reach for the duration of the call, and keeps the
traced regions in step with brk, mmap, munmap, mremap and mprotect.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter

import numpy as np

from ..arch.x86_64.memops import MemInstruction, memory_accesses
from ..binary.address_space import AddressSpace
from ..binary.maps import read_maps, unmapped_parts
from ..errors import UsageError
from ..process.events import SignalStop
from ..process.remote_syscall import PROT_NONE, RemoteSyscalls
from ..process.tracee import Tracee
from .hybrid.alias import ALIAS_BIT, AliasMap, origins_in
from .heap.alloc import AllocTracker
from .choices import DataChoices, FunctionTracingLinks
from .records import EventOrder, finish_rows, spool_rows
from .hybrid.paths import AccessPaths
from .hybrid.rewriting import COPY_AFTER
from .block_events import BlockEvents
from .gate import DataGate
from .syscalls import SyscallGate
from .fault.stubs import DataArea
from .guard import SegvGuard
from .heap.inline_hooks import NoEntryHooks, entry_hooks_for
from .numa_record import NumaRecorder
from .open_window import held_open, without_pages
from ..trace.format import ACCESS_DTYPE, ACCESS_FIELDS, DATA_DIR, KIND_LOAD, KIND_STORE, PAGE  # noqa: F401
from .regions import PageProtections, RegionSet, default_regions, page_protections, page_runs
from .fault.slow_path import SlowPath
from ..target.take_back import TakeBack
from .vfork_window import VforkWindow

# the bytes of a TCB from the thread pointer that madtrace's stubs read: its first
# word and glibc's thread id (calls/thread_pool.py searches this far for it)
TCB_WORDS = 0x800

SEGV_ACCERR = 2
PR_SET_PDEATHSIG = 1


class DataEngine:
    def __init__(self, tracee: Tracee, space: AddressSpace, out_dir: str,
                 choices: DataChoices | None = None, functions: FunctionTracingLinks | None = None,
                 defer=None, exact_threads: bool = True):
        """``choices``: what to record (DataChoices); ``functions``: what function
        tracing lends (FunctionTracingLinks; none without it); ``defer(events)``: stops
        met while every thread is held, handed to the run loop."""
        choices = choices or DataChoices()
        functions = functions or FunctionTracingLinks()
        only_regions, region_filter, data_in = \
            choices.only_regions, choices.region_filter, choices.data_in
        only_blocks, block_events, engine = choices.only_blocks, choices.block_events, choices.engine
        track_allocations, loads, stores = choices.track_allocations, choices.loads, choices.stores
        sequence_of, sequence_address = functions.sequence_of, functions.sequence_address
        patched_addresses, original_address = functions.patched_addresses, functions.original_address
        rings, entry_links = functions.rings, functions.entry_links
        self.only_regions = only_regions
        self.region_filter = region_filter
        self.exact_threads = exact_threads
        self.defer = defer or (lambda events: None)
        self.track_allocations = track_allocations
        self.patched_addresses = patched_addresses or set()
        self.loads, self.stores = loads, stores
        self.only_blocks = only_blocks
        self.block_events = block_events
        self.warnings: list[str] = []
        self.tracee = tracee
        self.space = space
        # at a launched image's entry point: lay out what earlier runs relocated
        # (hybrid/discovery_cache.py)
        self.warm_start = False
        self.out_dir = out_dir
        self.sequence_of = sequence_of or (lambda tid: 0)
        self.sequence_address = sequence_address or (lambda tid: 0)
        self.original_address = original_address or (lambda rips: rips)
        self.original_return = functions.original_return or (lambda address: address)
        self.regions = RegionSet([])
        self.protected = PageProtections()   # page -> original PROT_* bits, as runs
        self.decoded: dict[int, MemInstruction | None] = {}
        self.counts: Counter = Counter()      # (rip, "L"/"S") -> n
        self.chunks: dict[int, list[np.ndarray]] = {}   # tid -> ACCESS_DTYPE chunks not written yet
        self.rows: dict[int, int] = {}        # tid -> rows in chunks
        self.slow_rows: dict[int, list] = {}  # tid -> slow-path accesses (tuples)
        self.slow = 0            # faults handled by single-stepping
        self.untraced_faults = 0
        self.area: DataArea | None = None
        self.engine_kind = engine
        self.alias: AliasMap | None = None
        self.paths: AccessPaths | None = None
        self._rings, self.entry_links = rings, entry_links
        self.death_signal = False     # the target gets SIGSEGV (the guard) if madtrace dies
        self.guard: SegvGuard | None = None
        self.gate: DataGate | None = DataGate(self, data_in) if data_in else None
        self.armed = self.gate is None   # pages protected (always, without --data-in)
        self.alloc: AllocTracker | None = None
        self.entry_hooks = NoEntryHooks()     # hook stubs of malloc, memcpy...: inline_hooks.py
        self.syscalls = SyscallGate(self)
        self.blocks = BlockEvents(self)
        self.vfork = VforkWindow(self)
        self.numa = NumaRecorder(self)
        self.slow_path = SlowPath(self)
        self.held_stops = 0
        self.freed_accesses = 0  # accesses to blocks already freed (use after free)
        self.allocator_freed_accesses = 0   # the allocator's, in freed blocks (not the program's)
        self.order = EventOrder()    # event counter shared with the allocation tracker
        self._ring_full_seen = 0  # the fault loop's count of faults handed back on a full ring
        self.copy_after = COPY_AFTER   # hybrid: see rewriting.py
        self.active = False
        self.released: set[int] = set()   # pages given back when tracing stopped
        self.taken_away = 0     # traced pages a call unmapped as tracing stopped
        self.spared: dict[int, str] = {}     # traced pages left out -> why (a TCB's)
        self.slow_reasons: Counter = Counter()
        self._last_open_fault: dict[int, tuple[int, int]] = {}
        self._loop_stats = dict.fromkeys(("fast", "untraced", "syscalls", "writebacks",
                                          "writeback_errors", "moves"), 0)

    # ---------------------------------------------------------------- install
    def install(self) -> None:
        mappings = read_maps(self.tracee.pid)
        regions = list(self.only_regions or [])
        if self.only_regions is None or self.region_filter is not None:
            regions += [r for r in default_regions(self.space, mappings,
                                                   opt_in=self.region_filter is not None)
                        if self.region_filter is None or self.region_filter(r)]
        if not regions and not (self.syscalls.traces_default("[heap]")
                                or self.syscalls.traces_default("[anon 0x0]")):
            raise UsageError("no data region to trace")   # nor any the program could create
        self.regions = RegionSet(regions, clock=self.next_order)
        self.protected = page_protections(mappings, self.regions.pages())
        self._spare_thread_pointers()
        if self.gate is not None:
            self.gate.resolve(self.patched_addresses)   # refused before anything changes
        os.makedirs(os.path.join(self.out_dir, DATA_DIR), exist_ok=True)
        undo = TakeBack(self.tracee, "data tracing's set-up")   # should a later step fail
        try:
            with RemoteSyscalls(self.tracee) as rs:
                self.area = DataArea(self.tracee, rs)
                undo.add(lambda rs: self.area.close())
                self.area.loop.set_kinds(self.loads, self.stores)
                self.area.loop.set_safe_syscalls(self.syscalls.safe_numbers())
                self.guard = SegvGuard(self.area)
                self.tables_changed()
                undo.add(self.guard.take_back)
                self.guard.install(rs)            # before any page is protected
                if self.engine_kind == "hybrid":
                    undo.add(lambda rs: self.alias.privatize(rs, self.protected)
                                if self.alias is not None else None)
                    self._alias_all(rs, mappings)
                    self.paths = AccessPaths(self, self._rings)
                    self.paths.install(rs)
                    undo.add(lambda rs: self.paths.detach())
                    if self.tracee.launched:   # madtrace's death signals the guard: pages back
                        self.guard.set_tracer(os.getpid())
                        undo.add(lambda rs: rs.call("prctl", PR_SET_PDEATHSIG, 0))
                        rs.call("prctl", PR_SET_PDEATHSIG, signal.SIGSEGV)
                        self.death_signal = True
                    self.sequence_of = self.paths.calls_before
                    self.sequence_address = self.paths.head_address
                    outer = self.original_address
                    self.original_address = lambda rips: outer(self.paths.original_array(rips))
                if not self.tracee.launched:
                    self.guard.watch_tracer(rs)     # the same, through a pipe
                self.entry_hooks = entry_hooks_for(self, rs)
                undo.add(lambda rs: self.entry_hooks.detach())
                inline = self.entry_hooks if self.entry_hooks.stubs else None
                undo.add(lambda rs: [hooks.remove() for hooks in self.all_hooks()])
                if self.block_events:
                    self.warnings += self.blocks.install(rs, self.patched_addresses, inline)
                if self.gate is not None:
                    self.gate.install(rs, self.patched_addresses)
                if self.track_allocations:
                    self.alloc = AllocTracker(self.tracee, self.space, self.sequence_of,
                                              self.next_order, self.guard, self.out_dir,
                                              self.code_address, self.step_fault)
                    self.alloc.lock = self.paths.rings.lock if self.paths else self.alloc.lock
                    self.warnings += self.alloc.install(rs, self.patched_addresses, inline)
                undo.add(lambda rs: self.unprotect(rs, self.protected))
                self.protect(rs, self.protected)   # last: the hooks may call into the target
        except BaseException:
            self.warnings = undo.run()
            self.alias = self.paths = self.guard = None
            raise
        self.numa.initial_threads(list(self.tracee.threads))
        for tid in self.tracee.threads:
            self.add_thread(tid)
        self.tracee.on_new_thread.append(self.add_thread)
        self.tracee.trace_syscalls = True
        self.area.loop.set_resume(True)
        self.tracee.fast_wait = self._fast_wait
        self.tracee.after_stop = self.area.loop.flush
        self.active = True
        if self.paths is not None:
            self.paths.warm_start()

    def _spare_thread_pointers(self) -> None:
        """The page holding a thread's TCB (its thread pointer's first words and
        its id) is not traced: madtrace's stubs read those words through %fs on
        every record, and a protected page there made each of them fault (a
        static executable's main thread has its TCB in the traced heap: the
        program died with SIGSEGV).  Said in meta.json (``untraced_pages``)."""
        for tid, state in self.tracee.threads.items():
            if state.running or state.gone:
                continue
            base = self.tracee.get_regs(tid).fs_base
            if not base:
                continue
            for page in range(base & ~(PAGE - 1), base + TCB_WORDS, PAGE):
                if page in self.protected:
                    # it stays in its region: a relocated function's probes still record
                    # their accesses there; the program's own code no longer faults on it
                    self.spared[page] = f"the TCB of thread {tid} (its thread pointer)"
                    self.protected.drop_range(page, page + PAGE)

    def _alias_all(self, rs: RemoteSyscalls, mappings) -> None:
        """Every run of traced pages backed by shared memory mapped twice (alias.py)."""
        self.alias = AliasMap(self.tracee, rs)
        for start, end in page_runs(p for p, prot in self.protected.items() if prot):
            self.alias.alias(rs, start, end, origins_in(mappings, start, end), mappings)
        self.alias.update_access(self.protected)
        self.area.loop.set_alias(self.alias.bits.ctypes.data, ALIAS_BIT)
        self.area.through_alias = True
        self.guard.set_bitmap(self.alias.bitmap.address, self.alias.bitmap.size)

    def tables_changed(self) -> None:
        """The protected pages or the traced ranges changed: tell the C loop, the guard."""
        runs = [run for run in self.protected.runs() if run[2]] if self.armed else []
        held = held_open(self) if runs else set()      # to the slow path (open_window.py)
        self.area.loop.set_protected(without_pages(runs, held) if held else runs)
        self.area.loop.set_traced([(r.start, r.end) for r in self.regions.regions])
        self.entry_hooks.protected_changed([(start, end) for start, end, _ in runs])
        if self.guard is not None:
            self.guard.update(runs)

    def is_protected(self, page: int) -> bool:
        return self.armed and bool(self.protected.get(page))

    def page_note(self, address: int) -> str:
        """What the engine holds of the page of ``address`` (a fault delivered to
        the program: recording/crashes.py): its protection as the engine set it and
        whether probes reach it through the alias (its bitmap bit)."""
        page = address & ~(PAGE - 1)
        kept = self.protected.get(page)
        alias = self.alias
        aliased = alias is not None and alias.usable(page, page + PAGE)
        return (f"page {page:#x}: {'protected' if kept else 'not protected'} by the data engine"
                f"{'' if self.armed else ' (not armed)'}, "
                f"{'aliased' if aliased else 'not aliased'} for the probes")

    def protect(self, rs: RemoteSyscalls, pages) -> None:
        if not self.armed:
            return
        if self.area is not None and not self.area.loop.closed:
            # the guard's table first: a tracer dying between two mprotects is covered
            self.tables_changed()
        held = held_open(self)     # open for another thread's running call
        runs = [(start, end) for start, end, prot in self.protected.runs() if prot] \
            if pages is self.protected else \
            page_runs(p for p in pages if self.protected.get(p) and p not in held)
        for start, end in runs:
            rs.mprotect(start, end - start, PROT_NONE)

    def unprotect(self, rs: RemoteSyscalls, pages) -> None:
        if pages is self.protected:
            for start, end, prot in self.protected.runs():
                rs.mprotect(start, end - start, prot)
            return
        by_prot: dict[int, list[int]] = {}
        for page in pages:
            if page in self.protected:
                by_prot.setdefault(self.protected[page], []).append(page)
        for prot, group in by_prot.items():
            for start, end in page_runs(group):
                rs.mprotect(start, end - start, prot)

    def step_fault(self, tid: int, event: SignalStop) -> bool:
        """A breakpoint's hook stepped the instruction under it (heap/call_hooks.py)
        and it faulted: on a page data tracing protects, the instruction is
        recorded and carried out on the slow path (True); any other fault is the
        program's (False)."""
        if not self.active or event.si_code != SEGV_ACCERR:
            return False
        page = event.si_addr & ~(PAGE - 1)
        if not self.is_protected(page):
            return False
        self.slow_path.carry_out(tid, self.tracee.get_regs(tid), page)
        return True

    # --------------------------------------------------- --data-in: the gate
    def set_recording(self, tid: int, on: bool) -> None:
        if self.area is not None and tid in self.area.home:
            self.area.loop.set_recording(tid, on)

    def recording(self, tid: int) -> bool:
        return self.gate is None or self.gate.inside(tid)

    # ----------------------------------------------------------------- threads
    def add_thread(self, tid: int) -> None:
        self.numa.new_thread(tid)
        if self.paths is not None:
            self.paths.add_thread(tid)
        if self.area is not None and not self.area.add_thread(tid, self.sequence_address(tid)):
            self.warnings.append(f"thread {tid}: no free data slot, its accesses take the slow path")
        elif self.gate is not None:
            self.set_recording(tid, self.gate.inside(tid))

    def refresh_sequences(self) -> None:
        """Function tracing started after data tracing: give the loop the counters."""
        for tid, slot in list(self.area.home.items()):
            self.area.loop.set_thread(tid, slot, self.sequence_address(tid))

    def thread_exited(self, tid: int) -> None:
        if self.active and (tid == self.tracee.pid or len(self.tracee.threads) <= 1):
            self.numa.observe_all()     # the process ends: where its pages were
        for hooks in self.all_hooks():
            hooks.thread_exited(tid)
        if self.area is not None and not self.area.loop.closed:
            self.drain_fast()
            self.area.remove_thread(tid)
        if self.paths is not None:
            self.paths.thread_exited(tid)

    # ----------------------------------------------------------------- waiting
    def _fast_wait(self, block: bool):
        got = self.area.loop.wait(block)
        if self.paths is None:   # hybrid: the fault loop writes into the rings, the drain
            self.drain_fast()   # thread takes them out; the tracer's own events drain first
        return got

    def next_order(self) -> int:
        self.drain_fast()   # accesses before this allocation event keep their blocks
        if self.paths is not None:
            return self.paths.next_order()
        live = self.area is not None and not self.area.loop.closed
        self.order.value = max(self.order.value, self.area.loop.order if live else 0) + 1
        if live:
            self.area.loop.order = self.order.value
        return self.order.value

    def drain_fast(self) -> None:
        if self.paths is not None:
            self.paths.drain()
        if self.area is None or self.area.loop.closed:
            return
        records = self.area.loop.take_records()
        if not len(records):
            return
        out = np.zeros(len(records), dtype=ACCESS_DTYPE)
        for field in ("seq", "order", "addr", "size", "kind", "ilen", "first"):
            out[field] = records[field]
        out["rip"] = self.original_address(records["rip"])
        tids = records["tid"]
        for tid in np.unique(tids).tolist():
            finish_rows(self, tid, out[tids == tid])

    def count_freed(self, freed: np.ndarray, tids: np.ndarray) -> None:
        """Accesses to freed blocks: the program's (use after free), or the allocator's."""
        if freed.any() and self.alloc is not None:
            program, allocator = self.alloc.split_freed(freed, tids)
            self.freed_accesses += program
            self.allocator_freed_accesses += allocator

    # ------------------------------------------------------------------ faults
    def claim_signal(self, tracee: Tracee, event: SignalStop) -> bool:
        if tracee is not self.tracee:
            return False
        if event.signum == signal.SIGTRAP:
            self.drain_fast()
            regs = tracee.get_regs(event.tid)
            if (self.alloc is not None and self.alloc.claim_trap(tracee, event, regs)) or \
                    (self.gate is not None and self.gate.hooks.claim_trap(tracee, event, regs)) \
                    or self.blocks.claim_trap(tracee, event, regs):
                return True
            if self.guard is not None:
                self.guard.delivering(signal.SIGTRAP, event.tid)
            self._settle(event)
            return False
        if not self.active:
            # a fault taken just before tracing stopped, reported after: the page is
            # open again, so the instruction simply runs when the thread resumes
            if event.signum == signal.SIGSEGV and event.si_code == SEGV_ACCERR \
                    and event.si_addr & ~(PAGE - 1) in self.released:
                tracee.resume(event.tid, 0)
                return True
            return False
        if event.signum != signal.SIGSEGV:
            self._settle(event)
            return False
        page = event.si_addr & ~(PAGE - 1)
        if event.si_code == SEGV_ACCERR and not self.armed and self.protected.get(page) \
                and self._last_open_fault.get(event.tid) != (event.si_addr, page):
            # taken just before the gate opened the pages, reported after: run it again
            # (the same fault twice in a row is the target's own)
            self._last_open_fault[event.tid] = (event.si_addr, page)
            tracee.resume(event.tid, 0)
            return True
        self._last_open_fault.pop(event.tid, None)
        if event.si_code != SEGV_ACCERR or not self.is_protected(page):
            self.guard.delivering(signal.SIGSEGV, event.tid)
            self._settle(event)
            return False  # the target's own fault: delivered unchanged
        tid = event.tid
        regs = self.tracee.get_regs(tid)
        if self.paths is not None:
            full = self.area.loop.ring_full()
            if full != self._ring_full_seen:    # the fault loop found a ring full
                self._ring_full_seen = full
                self.paths.drain()
            if self.paths.fault(tid, regs):
                return True
        insn = self.decode(regs.rip)
        if self._fast_fault(tid, insn, event.si_addr):
            tracee.threads[tid].running = True
            if self.paths is not None:
                self.paths.fault_path_taken(self.area.loop, regs.rip, insn.address)
            return True
        self.slow_path.fault(tid, regs, page)
        return True

    def code_address(self, address: int) -> int:
        """The original code's address (relocated code: paths.py; moved prologues;
        a return address inside a call-site trampoline of function tracing)."""
        address = self.original_return(address)
        return int(self.original_address(np.array([address], dtype=np.uint64))[0])

    def _settle(self, event: SignalStop) -> None:
        """A signal is delivered to the thread: out of any probe first (paths.py)."""
        if self.paths is not None and self.active:
            self.paths.settle(event.tid, event.signum)

    def _fast_fault(self, tid: int, insn: MemInstruction | None, address: int) -> bool:
        area = self.area
        slot = area.home.get(tid)
        if insn is None or slot is None:
            return False
        if insn.atomic and len(self.tracee.threads) > 1 and not area.through_alias:
            self.slow_reasons["locked instruction with threads"] += 1
            return False
        if not area.register(insn, slot):
            self.slow_reasons[area.refused.get(insn.address, "refused")] += 1
            return False
        if insn.address not in area.emulated and area.busy(slot):
            # its stub was interrupted by a signal before it ran: another slot
            slot = area.move_thread(tid, self.sequence_address(tid))
            if slot is None or not area.register(insn, slot):
                self.slow_reasons["no free data slot"] += 1
                return False
        if self.paths is None:
            self.drain_fast()      # the loop's record buffer (hybrid: records go to the rings)
        return area.loop.handle_fault(tid, address)

    def decode(self, rip: int) -> MemInstruction | None:
        if rip not in self.decoded:
            self.decoded[rip] = memory_accesses(self.tracee.mem.read(rip, 16), rip)
        return self.decoded[rip]

    # ---------------------------------------------------------------- syscalls
    def claim_syscall(self, tracee, event) -> bool:
        return self.syscalls.claim(tracee, event)

    # ------------------------------------------------------- forks and leaving
    def all_hooks(self):
        """The breakpoint hooks in place: allocation tracker, --data-in, memcpy & co."""
        for hooks in (self.alloc.hooks if self.alloc else None,
                      self.gate.hooks if self.gate else None, self.blocks.hooks):
            if hooks is not None:
                yield hooks

    def fork_child(self, child: Tracee) -> None:
        """Undo data tracing in a fork child's copy of the memory; nothing to undo in a
        child forked before tracing started (its fork event handled only now)."""
        if self.area is None or not child.is_mapped(self.area.area.address):
            return
        for hooks in self.all_hooks():
            if hooks.active:
                hooks.remove(child.mem)
        self.entry_hooks.fork_child(child)
        if self.paths is not None and self.paths.rewriter is not None:
            self.paths.rewriter.fork_child(child)
        if self.active and self.protected:
            held = self.hold_threads() if self.alias is not None else []
            with RemoteSyscalls(child) as rs:
                if self.alias is not None:
                    self.alias.privatize(rs, self.protected)   # private copies, before it runs
                self.unprotect(rs, self.protected)
                self.guard.restore_in(rs)
            self.resume_threads(held)

    def hold_threads(self) -> list[int]:
        """Stop every running thread (a fork child's copies are taken meanwhile);
        returns those to resume."""
        if not any(s.running for s in self.tracee.threads.values()):
            return []
        events, held = self.tracee.hold_all()   # threads made meanwhile included
        self.defer(events)
        return held

    def resume_threads(self, tids) -> None:
        for tid in tids:
            state = self.tracee.threads.get(tid)
            if state is not None and not state.running:
                self.tracee.resume(tid)

    def _unhook(self) -> None:
        self.tracee.fast_wait = None
        self.tracee.after_stop = None
        if self.add_thread in self.tracee.on_new_thread:
            self.tracee.on_new_thread.remove(self.add_thread)

    def detach(self) -> None:
        """Restore every page's protection (all threads stopped)."""
        if not self.active:
            return
        self.drain_fast()
        self.numa.observe_all()
        self.area.loop.flush()
        if self.tracee.threads:
            self.entry_hooks.detach()     # before the alias goes: memcpy through it finish
        if self.paths is not None and self.tracee.threads:
            self.paths.detach()      # threads out of probes, entries back, last records
        for tid in list(self.tracee.threads):
            self.area.leave(tid)
        self.syscalls.leave(self.tracee)      # calls blocked on alias pointers
        self.area.discard_unfinished()
        for hooks in self.all_hooks():
            if hooks.active:
                hooks.remove()
        self.active = False
        self._unhook()
        self.tracee.trace_syscalls = False
        if self.tracee.threads:
            with RemoteSyscalls(self.tracee) as rs:
                # each step whatever the one before did: a page left protected
                # kills the program at its next access; the first error is raised
                # once all are done (the tracer then keeps its areas mapped)
                failed: list[Exception] = []
                steps = [lambda rs: rs.call("prctl", PR_SET_PDEATHSIG, 0)] if self.death_signal \
                    else []
                steps += [self.guard.remove, self._forget_taken_away]
                if self.alias is not None:
                    steps.append(lambda rs: self.alias.privatize(rs, self.protected))
                steps.append(lambda rs: self.unprotect(rs, self.protected))
                for step in steps:
                    try:
                        step(rs)
                    except Exception as exc:    # noqa: PERF203 - a handful of steps
                        failed.append(exc)
                if failed:
                    raise failed[0]
        self.released = set(self.protected)
        self.loop_stats()
        self.area.close()

    def _forget_taken_away(self, rs: RemoteSyscalls) -> None:
        """Before the restore: what a thread stopped inside munmap, mremap or
        mmap(MAP_FIXED) took away is forgotten (its exit stop, handled after the
        restore, came too late).  Restoring an unmapped aliased range failed,
        which left every other traced page protected: the detached program died
        at its next access."""
        maps = read_maps(self.tracee.pid)
        if self.alias is not None:
            for lo, hi in self.alias.gone(maps):
                self.alias.unmapped(rs, lo, hi)
                self.protected.drop_range(lo, hi)
                self.taken_away += (hi - lo) // PAGE
        for start, end, _prot in self.protected.runs():
            for lo, hi in unmapped_parts(start, end, maps):
                self.protected.drop_range(lo, hi)
                self.taken_away += (hi - lo) // PAGE

    def forget_after_exec(self) -> None:
        self.drain_fast()
        if self.paths is not None:
            self.paths.finish()
        if self.death_signal and self.tracee.threads:
            with RemoteSyscalls(self.tracee) as rs:    # the new image has no guard
                rs.call("prctl", PR_SET_PDEATHSIG, 0)
        if self.guard is not None:
            self.guard.unwatch(None)     # the target's end went with the exec (O_CLOEXEC)
        for hooks in self.all_hooks():
            hooks.active = False
        self.entry_hooks.forget()
        self.active = False
        self._unhook()
        self.tracee.trace_syscalls = False
        self.protected.clear()
        if self.alias is not None:
            self.alias.forget()
        self.loop_stats()
        self.area.close()

    # ----------------------------------------------------------------- results
    def write(self) -> None:
        self.drain_fast()
        if self.paths is not None:
            if self.tracee.threads:
                self.paths.write()
            else:
                self.paths.finish()      # the target is gone: the last records
        if self.alloc is not None:
            self.alloc.write(self.out_dir)
        self.blocks.write(self.out_dir)
        if self.active:
            self.numa.observe_all()     # a snapshot: where the pages are now
        self.numa.write(self.out_dir)
        with self.paths.rings.lock if self.paths is not None else contextlib.nullcontext():
            for tid in list(self.chunks):
                spool_rows(self, tid)

    @property
    def faults(self) -> int:
        return self.loop_stats()["fast"] + self.slow

    def live_counts(self) -> dict[str, int]:
        """What a recording's status line shows, read from its own thread while the
        target runs: counters only (the C loop's as last read), nothing that calls
        into the target or the loop.  ``accesses``: recorded so far; ``on_faults``:
        of those, made on the fault path; ``relocated``: functions copied with probes."""
        faults = int(self._loop_stats.get("fast", 0)) + self.slow
        if self.paths is None:
            return {"accesses": faults, "on_faults": faults, "relocated": 0}
        probe, fault = self.paths.records.by_path
        rewriter = self.paths.rewriter
        out = {"accesses": probe + fault, "on_faults": fault,
               "relocated": int(rewriter.stats.get("copies", 0)) if rewriter is not None else 0}
        if self.paths.rings is not None:
            totals = self.paths.rings.totals()
            out["dropped"] = totals["dropped"] + totals["unregistered_records"]
        return out

    def loop_stats(self) -> dict[str, int]:
        """The C loop's counters (kept when it is closed)."""
        if self.area is not None and not self.area.loop.closed:
            self._loop_stats = self.area.loop.stats()
        return self._loop_stats

    def count_items(self):
        """((instruction, "L"/"S"), accesses) of every access recorded so far."""
        counts = Counter(self.counts)
        if self.paths is not None:
            counts.update(self.paths.records.counts())
        return counts.items()

    def access_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (rip, kind), n in self.count_items():
            entry = out.setdefault(self.instruction_name(rip), {"L": 0, "S": 0})
            entry[kind] += n
        return out

    def instruction_name(self, rip: int) -> str:
        """``func+0xoff`` of an instruction (``module+0xoff`` without a symbol)."""
        return self.space.code_location(rip)

