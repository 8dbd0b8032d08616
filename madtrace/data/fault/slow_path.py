# SPDX-License-Identifier: GPL-2.0-or-later
"""The data engine's slow path: an instruction neither the fault loop nor a stub
can carry out (string instructions other than movs/stos, control transfers
through memory it cannot emulate, locked instructions while several threads
run, anything the re-encoder refuses) is recorded here, the pages it touches
are opened, it is single-stepped with the other threads held, and the pages
are closed again."""

from __future__ import annotations

import signal

import numpy as np

from ...arch.x86_64.memops import effective_address
from ...process.events import SignalStop
from ...process.remote_syscall import RemoteSyscalls
from ...process.stepping import step
from ..records import append_rows
from ...trace.format import ACCESS_DTYPE, ACCESS_FIELDS, KIND_LOAD, KIND_STORE, PAGE

SEGV_ACCERR = 2


class SlowPath:
    def __init__(self, engine):
        self.engine = engine
        self.held: set[int] | None = None   # threads stopped while one thread's pages are open

    def fault(self, tid: int, regs, page: int) -> None:
        self.carry_out(tid, regs, page)
        self.engine.tracee.resume(tid, 0)

    def carry_out(self, tid: int, regs, page: int) -> None:
        """The faulting instruction at ``regs.rip`` recorded and run once, its pages
        open for that instruction alone; the thread stays stopped after it."""
        e = self.engine
        e.slow += 1
        self.hold_others(tid)
        pages = self.record(tid, regs, {page})
        self.single_step(tid, pages)
        self.release_others()

    # threads: while pages are open for one thread's instruction, the others must not
    # run, or their accesses to those pages would go unseen
    def hold_others(self, tid: int) -> None:
        e = self.engine
        if not e.exact_threads or len(e.tracee.threads) < 2:
            return
        if not any(s.running for t, s in e.tracee.threads.items() if t != tid):
            return
        events, held = e.tracee.hold_all()    # threads made meanwhile included
        e.defer(events)
        self.held = (self.held or set()) | (set(held) - {tid})
        e.held_stops += 1

    def release_others(self) -> None:
        e = self.engine
        held, self.held = self.held, None
        for t in held or ():
            state = e.tracee.threads.get(t)
            if state is not None and not state.running:
                e.tracee.resume(t)

    def record(self, tid: int, regs, pages: set[int]) -> set[int]:
        """Slow path: record the accesses of the instruction at rip; returns the
        protected pages it touches."""
        e = self.engine
        e.drain_fast()
        insn = e.decode(regs.rip)
        recorded = False
        if insn is not None:
            seq = e.sequence_of(tid)
            rip = int(e.original_address(np.array([regs.rip], dtype=np.uint64))[0])
            first = 1
            rows = []
            for op in insn.operands:
                address = effective_address(op, regs, insn)
                for page in range(address & ~(PAGE - 1), address + op.size, PAGE):
                    if e.is_protected(page):
                        pages.add(page)
                if e.regions.find(address) is None or not e.recording(tid):
                    continue
                recorded = True
                block_id, freed = e.alloc.block_at(address) if e.alloc is not None else (0, 0)
                if e.only_blocks is not None and block_id not in e.only_blocks:
                    continue
                e.count_freed(np.array([freed != 0]), np.array([tid]))   # program / allocator
                # a read-modify-write operand is one load, then one store
                for wanted, letter, kind in ((op.load and e.loads, "L", KIND_LOAD),
                                             (op.store and e.stores, "S", KIND_STORE)):
                    if wanted:
                        e.counts[(rip, letter)] += 1
                        rows.append((seq, e.next_order(), rip, address, block_id,
                                     op.size, kind, freed, insn.size, first))
                        first = 0
            if rows:
                chunk = np.zeros(len(rows), dtype=ACCESS_DTYPE)
                for field, column in zip(ACCESS_FIELDS, zip(*rows)):
                    chunk[field] = column
                append_rows(e, tid, chunk)
        if not recorded:
            e.untraced_faults += 1
        return pages

    def single_step(self, tid: int, pages: set[int]) -> None:
        """Slow path: open the pages, single-step the instruction, close them."""
        e = self.engine
        opened: set[int] = set()
        state = e.tracee.threads[tid]
        while True:
            new = pages - opened
            if new:
                with RemoteSyscalls(e.tracee, tid) as rs:
                    e.unprotect(rs, new)
                opened |= new
            event = step(e.tracee, tid)
            if isinstance(event, SignalStop) and event.signum == signal.SIGTRAP:
                break
            if isinstance(event, SignalStop) and event.signum == signal.SIGSEGV:
                page = event.si_addr & ~(PAGE - 1)
                if event.si_code == SEGV_ACCERR and e.is_protected(page) and page not in opened:
                    pages.add(page)  # a page the decoder did not predict: open it too
                    continue
                state.pending_signal = event.signum  # a genuine fault of the target
                break
            if isinstance(event, SignalStop):
                state.pending_signal = event.signum  # delivered when it resumes
                continue
            break
        if opened and tid in e.tracee.threads:
            with RemoteSyscalls(e.tracee, tid) as rs:
                e.protect(rs, opened)
