# SPDX-License-Identifier: GPL-2.0-or-later
"""What a recording reports at its end (part of recording.Recording): the call
counts and drop accounting of function tracing, the counts and engine figures
of data tracing (its data/ files written), what the recording cost the tracer
(peak RSS, symbols and DWARF), and the store written last.

``Results`` is a mixin of ``recording.Recording``: it uses its engines
(functions, data), options, prefetches and log.
"""

from __future__ import annotations

import resource
import sys

from ..binary import dwarf_cache
from ..progress import Activity


class Results:
    def _function_results(self, final: bool) -> dict:
        """Call counts and drop accounting; ``final``: stop draining and close the
        record files (the end of the recording)."""
        engine = self.functions
        if engine is None or engine.rings is None:
            return {"calls": {}, "dropped_events": 0}
        if final:
            if engine.active:
                engine.rings.stop()
            engine.rings.close()
        totals = engine.rings.totals()
        return {
            "calls": engine.call_counts(),
            "dropped_events": totals["dropped"] + totals["unregistered_records"],
            "function_tracing": dict(totals, timestamps=engine.timestamps,
                                     threads_recorded=len(engine.rings.records_per_thread),
                                     records=sum(engine.rings.records_per_thread.values()),
                                     # records written again after a signal's handler
                                     signals_in_record_writes=engine.writer_windows.rewound,
                                     patch_report=engine.report),
        }

    def _output_failure(self):
        """The drain's write error (OutputError) that stopped recording, if any: the
        function tracer's rings, or the hybrid data engine's own."""
        for owner in (self.functions, self.data.paths if self.data is not None else None):
            rings = getattr(owner, "rings", None)
            if rings is not None and rings.failure is not None:
                return rings.failure
        return None

    def _detach_results(self) -> dict:
        """What a detach could not restore or take out (an engine's hook failed),
        said, and kept in meta.json."""
        failures = list(self.controller.detach_failures) if self.controller is not None else []
        for failure in failures:
            self.log(f"warning: detach: {failure}")
        return {"detach_failures": failures} if failures else {}

    def _data_results(self) -> dict:
        """Writes the data files (data/) into the trace directory; returns the counts."""
        engine = self.data
        if engine is None:
            return {"accesses": {}}
        engine.write()
        loop = engine.loop_stats()
        windows = engine.syscalls.open_windows + engine.blocks.open_windows
        pages = engine.syscalls.window_pages + engine.blocks.window_pages
        if windows:
            self.log(open_windows_line(windows, pages, {"engine": engine.engine_kind,
                                                        "gate": engine.gate is not None}))
        return {"accesses": engine.access_counts(),
                "data_tracing": {"faults": engine.faults,
                                 # breakpoint stops of the allocator, memcpy & co. and
                                 # --data-in hooks, and of the hook stubs' slow paths
                                 "traps": sum(h.stops for h in engine.all_hooks()) +
                                 engine.entry_hooks.trap_stops,
                                 "untraced_faults": loop["untraced"] + engine.untraced_faults,
                                 "fast_path": loop["fast"], "slow_path": engine.slow,
                                 "slow_reasons": dict(engine.slow_reasons),
                                 "store_writebacks": loop["writebacks"],
                                 "store_writeback_errors": loop["writeback_errors"],
                                 "syscalls_resumed_natively": loop["syscalls"],
                                 "mapped_regions": engine.syscalls.mapped_regions,
                                 # pages a thread unmapped in a call it was inside of when
                                 # tracing stopped: forgotten, not restored
                                 "unmapped_at_detach": engine.taken_away,
                                 # traced pages left out, each with why (a TCB's page)
                                 "untraced_pages": {f"{p:#x}": why for p, why in
                                                    engine.spared.items()},
                                 "allocations": engine.alloc.count if engine.alloc else 0,
                                 # allocator calls other threads made while a breakpoint was
                                 # stepped over: those calls may be missing
                                 "allocation_windows": engine.alloc.missed_windows if engine.alloc else 0,
                                 "freed_accesses": engine.freed_accesses,
                                 "allocator_freed_accesses": engine.allocator_freed_accesses,
                                 "stubs": len(engine.area.stubs) if engine.area else 0,
                                 "syscalls_opened": engine.syscalls.opened,
                                 "syscalls_redirected": engine.syscalls.redirected_calls,
                                 "block_calls_redirected": engine.blocks.redirected,
                                 # system calls and memcpy/memset run with traced pages open
                                 # while other threads ran: their accesses meanwhile are missed
                                 "open_windows": windows,
                                 "open_window_pages": {f"{p:#x}": n for p, n in pages.most_common(16)},
                                 "block_events": engine.blocks.counts(),
                                 "gate": {"functions": engine.gate.names,
                                          "entries": engine.gate.entries,
                                          "arms": engine.gate.arms} if engine.gate else None,
                                 "guard": {"installed": engine.guard.installed if engine.guard else False,
                                           "reinstalls": engine.guard.reinstalls if engine.guard else 0,
                                           "kernel_resets_undone":
                                               engine.guard.resets_undone if engine.guard else 0},
                                 "held_stops": engine.held_stops,
                                 # vfork children that ran untraced in the shared memory
                                 "vfork_windows": engine.vfork.windows,
                                 "regions": [[r.start, r.end, r.label] for r in engine.regions.regions],
                                 # every version of each, with the orders it lasted
                                 "region_history": engine.regions.history,
                                 "engine": engine.engine_kind,
                                 "paths": engine.paths.report() if engine.paths else None,
                                 "alias": engine.alias.report() if engine.alias else None}}

    def _wait_for_dwarf(self, out) -> None:
        """The debug info read while the target ran is needed now (naming the
        accesses): wait for what is left, saying so when it takes long."""
        pending = [p for p in self.prefetches if p.thread.is_alive()]
        if pending:
            names = ", ".join(sorted({i.name for p in pending for i in p.images}))
            with Activity(f"reading the debug info of {names} (once per binary)", out):
                for prefetch in pending:
                    prefetch.wait()

    def tracer_stats(self, write_seconds: float) -> dict:
        """What the recording cost the tracer: its peak RSS (bytes; the DWARF
        reader's children apart), the time the write-out took after the target
        ended, the binaries whose DWARF was read while the target ran."""
        for prefetch in self.prefetches:
            prefetch.wait()
        return {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "dwarf_reader_peak_rss_bytes": max((p.peak_rss for p in self.prefetches), default=0),
                "dwarf_read_while_running": sum(p.built for p in self.prefetches),
                "dwarf_errors": [e for p in self.prefetches for e in p.errors],
                "symbols_seconds": round(self.symbols_seconds, 3),
                "dwarf_seconds": round(dwarf_cache.seconds, 3),
                "write_seconds": round(write_seconds, 3)}

    def _finish_store(self) -> None:
        """With --store: DIR/store, once the target has ended (progress on stderr
        when it takes long).  A failure leaves the store incomplete: it is then
        built on first use."""
        if not self.options.store:
            return
        from ..trace.store_writer import build_store
        try:
            build_store(self.output, None if self.options.quiet else sys.stderr)
        except Exception as exc:   # the trace itself is written: say so, go on
            self.log(f"the store was not written ({type(exc).__name__}: {exc}); "
                     "it is built when a query, export or report needs it")


def open_windows_line(windows: int, pages: dict, tracing: dict) -> str:
    """What an open window costs, said (summary, the end of a recording);
    ``tracing``: meta.json's data_tracing (the fault engine's windows are the
    ones the hybrid engine does without, unless tracing inside chosen
    functions needed the fault engine)."""
    top = sorted(pages.items(), key=lambda kv: -kv[1])[:3]
    where = ", ".join(f"{int(p, 16) if isinstance(p, str) else p:#x} ({n}x)" for p, n in top)
    line = (f"{windows} times, traced pages ({where}{', ...' if len(pages) > 3 else ''}) were "
            "open for a system call or memcpy/memset while other threads ran: accesses those "
            "threads made to them meanwhile may be missing")
    if tracing.get("engine") == "fault" and not tracing.get("gate"):
        line += " (the hybrid engine reaches that memory through its alias: --data-engine hybrid)"
    return line
