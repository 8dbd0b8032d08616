# SPDX-License-Identifier: GPL-2.0-or-later
"""The two paths of the hybrid data engine, and which one an instruction takes.

Every access to a traced page of an instruction nothing has rewritten faults
(discovery, as in the fault engine).  At such a fault ``fault`` first asks
the rewriter (rewriting.py) to move the instruction's function to a copy
with probes and the thread into it: from then on the instruction records its
own accesses inside the target, through the alias (alias.py), without a
trap (the probe path).  What the rewriter leaves (``Rewriter.refused``: code
outside known functions, instructions a probe cannot take) stays on the
fault path (fault_loop.c), whose records now go into the same rings, so that
both paths' accesses, and the call records, keep one order per thread.

Rings: the function tracer's when it runs, else a RingSet of the data
engine's own.  Data records are taken out of them by the drain
(rings.py ``data_sink``) and become access rows (data_records.py).

``settle`` runs before a signal is delivered to a thread: a thread stopped
inside a probe is moved out of it first (rewriting.py), so that a handler
sees the registers of the original program and its own accesses come after
the interrupted one's, in order.
"""

from __future__ import annotations

import signal
from collections import Counter

import numpy as np

from ...target.areas import SharedArea
from ...target.templates import load_injector
from ...process.remote_syscall import RemoteSyscalls
from ..records import RingRecords
from ..instruction_table import FAULT, KIND_LOAD, KIND_STORE, InstructionTable
from .rewriting import COLD_ASK, GROUP, Rewriter
from ...rings.rings import RingSet

ASK_AGAIN = 63          # mask: every 64th fault the loop meets of a waiting instruction
# mask: every 16th move the loop would make comes to the rewriter, which may have more
# to do (an entry to point at the copy again, a stale copy: rewriting.py discover)
MOVE_ASK = 15
ON_FAULTS_LISTED = 2000   # instructions named in the report's on_faults
SYNCHRONOUS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP}


class AccessPaths:
    def __init__(self, engine, rings: RingSet | None):
        self.engine = engine
        self.ids = InstructionTable()
        self.rings = rings
        self.own_rings = rings is None
        self.records = RingRecords(engine, self.ids, engine.out_dir)
        self.rewriter: Rewriter | None = None
        self.fault_reasons: Counter = Counter()   # why instructions stayed on faults
        self.on_faults: dict[int, str] = {}        # such an instruction -> why

    # ------------------------------------------------------------- install
    def install(self, rs: RemoteSyscalls) -> None:
        engine = self.engine
        L = load_injector()
        if self.own_rings:
            area = SharedArea(rs, RingSet.size_for(L), "madtrace-rings", executable=False,
                              group=GROUP)
            self.rings = RingSet(area, L, engine.out_dir, map_chunk=self._map_chunk)
            self.rings.ensure_free(len(engine.tracee.threads))
            self.rings.set_enabled(True)
        self.rings.data_sink = self.records
        engine.area.loop.set_epoch(self.rings.splitter.epoch_address())
        self.rewriter = Rewriter(engine, self.rings.control_address, engine.alias.bitmap.address,
                                 self.ids, L, rings=self.rings)
        self.rewriter.copy_after = engine.copy_after
        loop = engine.area.loop
        self.rewriter.now_hot = lambda addresses: [loop.ask_again(a, 0) for a in addresses]
        self.rewriter.loop_move = lambda original, to: loop.move_to(original, to, True, True,
                                                                    MOVE_ASK)
        engine.area.loop.set_ring_mode(True)
        engine.area.loop.set_kinds(True, True)      # loads/stores-only: at the drain
        engine.area.ids_of = self.ids_of
        if self.own_rings:
            for tid in engine.tracee.threads:
                self.add_thread(tid)
            self.rings.start()

    def _map_chunk(self, size: int) -> SharedArea:
        """Ring blocks for more threads (a stopped thread runs the system calls)."""
        with RemoteSyscalls(self.engine.tracee) as rs:
            return SharedArea(rs, size, "madtrace-rings", executable=False, group=GROUP)

    def warm_start(self) -> None:
        """What earlier runs relocated, laid out before the program runs
        (discovery_cache.py): at a launched image's entry point only (at an attach
        or a live session's ``data on`` the threads are anywhere, and discovery
        moves them one fault at a time as before); MADTRACE_WARM_START=0 turns it
        off (the comparison), and so does --copy-after N > 1 (functions copied
        once hot in this run)."""
        if self.rewriter.warm_start_wanted():
            self.rewriter.warm_start()

    def add_thread(self, tid: int) -> None:
        if self.own_rings:
            self.rings.register(tid, self.engine.tracee.get_regs(tid).fs_base)

    def thread_exited(self, tid: int) -> None:
        if self.own_rings:
            self.rings.unregister(tid)

    def head_address(self, tid: int) -> int:
        return self.rings.head_address(tid)

    # -------------------------------------------------------------- records
    def drain(self) -> None:
        """Every data record written so far becomes an access row."""
        self.rings.drain_all()

    def calls_before(self, tid: int) -> int:
        """The call records the (stopped) thread wrote so far: the seq of an event now."""
        with self.rings.lock:
            self.rings.drain_one(tid)
            return self.rings.records_per_thread.get(tid, 0) + \
                self.rings.splitter.pending_calls(tid)     # behind a record awaiting a stamp

    def next_order(self) -> int:
        """An event's order: after every access recorded so far."""
        with self.rings.lock:
            self.rings.drain_all()
            return self.engine.order.tick()

    def original(self, rip: int) -> int:
        return self.rewriter.original_address(rip)

    def original_array(self, rips: np.ndarray) -> np.ndarray:
        return np.array([self.rewriter.original_address(int(r)) for r in rips], dtype=np.uint64)

    def ids_of(self, insn, how: str | None) -> tuple[int, int, int]:
        """Instruction ids of an instruction the fault loop carries out (ring mode)."""
        rip = int(self.engine.original_address(np.array([insn.address], dtype=np.uint64))[0])

        def add(size, kind, first=1):
            return self.ids.add(rip, size, kind, insn.size, first, FAULT)
        if how == "movs":
            src, dst = insn.operands[1], insn.operands[0]
            return (add(src.size, KIND_LOAD), add(dst.size, KIND_STORE, 0), add(dst.size, KIND_STORE))
        op = insn.operands[0] if how != "jmp" and how != "call" else insn.operands[-1]
        kind = KIND_LOAD if how in ("jmp", "call") else \
            (KIND_LOAD if op.load else 0) | (KIND_STORE if op.store else 0)
        ident = add(op.size, kind)
        return ident, ident, ident          # stos: the store (first of its execution)

    # --------------------------------------------------------------- faults
    def fault(self, tid: int, regs) -> bool:
        """A fault on a traced page: True when the thread moved to a probe."""
        if self.rewriter.discover(tid, regs):
            return True
        original = self.original(regs.rip)
        if self.rewriter.cold(original):
            return False                 # its function is copied once hot (rewriting.py)
        if original not in self.on_faults:
            why = self.rewriter.why_not(original)
            self.on_faults[original] = why
            self.fault_reasons[why] += 1
        return False

    def fault_path_taken(self, loop, rip: int, address: int) -> None:
        """The fault loop carries the instruction at ``rip`` (``address`` in the
        original code) from now on.  If its function has a copy not in use yet,
        the loop gives every ASK_AGAIN-th fault of it back, to move it over once
        the copy is ready (rewriting.py ``waiting``)."""
        if self.rewriter is None:
            return
        original = self.original(rip)
        if self.rewriter.waiting(original):
            loop.ask_again(address, ASK_AGAIN)
        elif self.rewriter.cold(original):
            loop.ask_again(address, COLD_ASK)

    def settle(self, tid: int, signum: int) -> None:
        regs = self.engine.tracee.get_regs(tid)
        self.rewriter.settle(tid, regs, synchronous=signum in SYNCHRONOUS)

    # -------------------------------------------------------------- leaving
    def detach(self) -> None:
        self.rewriter.detach()
        self.rewriter.entry_cache.save()
        self.rewriter.analysis_cache.save()
        self.rewriter.discovery.save()
        if self.own_rings:
            self.rings.set_enabled(False)
            self.rings.stop()
        else:
            self.drain()

    def finish(self) -> None:
        """The target is gone (or stays untraced): the last records, no more draining."""
        if self.rewriter is not None:
            self.rewriter.entry_cache.save()
            self.rewriter.analysis_cache.save()
            self.rewriter.discovery.save()
        if self.own_rings:
            self.rings.stop()
            self.rings.close()
        else:
            self.drain()
        self.write()
        self.records.close()

    def write(self) -> None:
        """What the trace directory needs to read the records written so far: the
        instruction table, and every block taken in its file."""
        with self.rings.lock:
            self.records.write_table()
            self.records.flush()

    def _on_faults_named(self) -> dict[str, str]:
        """Each instruction the fault path carries, by its place in the program
        (``libc.so.6+0x9a1f3 (memchr+0x13)``), and why (the first ON_FAULTS_LISTED)."""
        space = self.engine.space
        out = {}
        for address in sorted(self.on_faults)[:ON_FAULTS_LISTED]:
            module = space.module_for(address)
            if module is None:
                out[f"{address:#x}"] = self.on_faults[address]
                continue
            rel = address - module.bias
            symbol = module.image.symbol_at(rel)
            at = f" ({symbol.name}+{rel - symbol.address:#x})" if symbol is not None else ""
            out[f"{module.name}+{rel:#x}{at}"] = self.on_faults[address]
        return out

    def report(self) -> dict:
        totals = self.rings.totals() if self.rings is not None else {}
        probe, fault = self.records.by_path
        return {"accesses_by_path": {"probe": probe, "fault": fault},
                "data_records": self.records.records,
                "records_outside_traced_bytes": self.records.outside,
                "instructions_on_faults": len(self.on_faults),
                "on_faults_why": dict(self.fault_reasons),
                "on_faults": self._on_faults_named(),
                "ring_full_faults": self.engine.area.loop.ring_full()
                if not self.engine.area.loop.closed else 0,
                "dropped": totals.get("dropped", 0) + totals.get("unregistered_records", 0),
                "ring_waits": totals.get("ring_waits", 0),
                "hooks": self.engine.entry_hooks.report(),
                "rewriter": dict(self.rewriter.report() if self.rewriter else {},
                                 moved_by_fault_loop=self.engine.loop_stats().get("moves", 0))}
