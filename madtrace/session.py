"""A recording session: launch or attach, run the target under the controller,
and write the trace directory.  The CLI, the REPL and the daemon all drive
recordings through this class."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field

from .binary.address_space import AddressSpace
from .binary.maps import read_maps
from .capture.data import DataEngine
from .capture.regions import Region, region_matcher
from .inject.engine import FunctionTracer
from .errors import StrippedBinaryError, UnknownSymbolError, UsageError
from .process.controller import Controller
from .process.cpu import SameCpu
from .process.events import ThreadExited, ThreadKilled
from .process.tracee import Tracee, check_traceable, resolve_command
from .trace import store
from .trace.reader import entry_counts


@dataclass
class RecordOptions:
    output: str
    force: bool = False
    functions: list[str] = field(default_factory=list)
    data: bool = False
    follow_forks: bool = False
    start_at: str = "entry"          # "entry" or "main"
    duration: float | None = None
    quiet: bool = False
    trace_functions: bool = True     # default: every function of the main executable
    timestamps: bool = True
    method: str = "auto"             # patching method: auto (exact), callsite, entry
    track_allocations: bool = True   # with data: malloc/calloc/realloc/free named blocks
    data_regions: list[str] = field(default_factory=list)   # region label globs
    data_only: list[str] = field(default_factory=list)      # variables or heap block numbers
    data_in: list[str] = field(default_factory=list)        # record only inside these functions
    loads: bool = True
    stores: bool = True
    store: bool = False              # write DIR/store while the target runs (store_writer.py)
    data_engine: str = "fault"       # hybrid (alias + rewritten code) or fault (a stop per access)


BLOCK_NAME = re.compile(r"^<?(?:malloc|calloc|realloc|freed:)?(\d+)(?:@.*)?>?$")


def data_selection(options: RecordOptions, space: AddressSpace) -> dict:
    """DataEngine keywords for --regions, --only and --data-in."""
    selection: dict = {}
    if options.data_regions:
        selection["region_filter"] = region_matcher(options.data_regions)
    variables, blocks = [], set()
    for name in options.data_only:
        block = BLOCK_NAME.match(name)
        if block:
            blocks.add(int(block.group(1)))
            continue
        variable = space.find_variable(name)
        variables.append(Region(variable.address, variable.address + max(variable.variable.size, 1),
                                variable.variable.name))
    if variables:
        selection["only_regions"] = variables
    if blocks:
        selection["only_blocks"] = blocks
        if "region_filter" not in selection:
            selection["region_filter"] = region_matcher(["[heap]", "[anon*"])
    if options.data_in:
        selection["data_in"] = list(options.data_in)
    return selection


def exit_code_of(event) -> int | None:
    if isinstance(event, ThreadExited):
        return event.status
    if isinstance(event, ThreadKilled):
        return 128 + event.signum
    return None


def read_maps_text(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return f.read()
    except OSError:
        return ""


class Recording:
    def __init__(self, options: RecordOptions):
        self.options = options
        if options.functions and not options.trace_functions:
            raise UsageError("-f and --no-functions contradict each other")
        if options.start_at not in ("entry", "main"):
            raise UsageError(f"--start-at must be 'entry' or 'main', not {options.start_at!r}")
        self.tracee: Tracee | None = None
        self.controller: Controller | None = None
        self.address_space: AddressSpace | None = None
        self.meta: dict = {}
        self._maps_end = ""
        self._warned_stripped = False
        self.functions: FunctionTracer | None = None
        self.data: DataEngine | None = None
        self.store_writer = None             # trace.store_writer.StoreWriter

    def log(self, message: str) -> None:
        if not self.options.quiet:
            print(f"madtrace: {message}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------- start
    def launch(self, argv: list[str]) -> None:
        resolve_command(argv[0])  # a missing command fails before anything is written
        self._create_output()
        self.meta.update(mode="launch", command=list(argv))
        try:
            self.tracee = Tracee.spawn(argv)
        except BaseException:
            self._remove_output()
            raise
        try:
            self.controller = Controller(self.tracee, follow_forks=self.options.follow_forks)
            self._install_signal_handlers()
            self.controller.run_to(self.tracee.auxv_entry())
            if self.tracee.exit_event is None:
                self._load_address_space()
                if self.options.start_at == "main":
                    self.controller.run_to(self._main_address())
            self._after_start()
        except BaseException:
            self.tracee.kill()  # a launch that failed to start must not run untraced
            self._remove_output()
            raise

    def _main_address(self) -> int:
        main = self.address_space.main
        try:
            return self.address_space.find_symbol("main").address
        except UnknownSymbolError:
            if main is not None and main.image.stripped:
                raise StrippedBinaryError(
                    f"{main.name} is stripped: main() cannot be found for --start-at main") from None
            raise

    def attach(self, pid: int) -> None:
        check_traceable(pid)
        self._create_output()
        self.meta.update(mode="attach", pid=pid)
        try:
            self.tracee = Tracee.attach(pid)
        except BaseException:
            self._remove_output()
            raise
        self.controller = Controller(self.tracee, follow_forks=self.options.follow_forks)
        self._install_signal_handlers()
        try:
            self.meta["command"] = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:-1]
            self.meta["command"] = [a.decode(errors="replace") for a in self.meta["command"]]
        except OSError:
            pass
        try:
            self._load_address_space()
            self._after_start()
        except BaseException:
            self.tracee.detach()
            self._remove_output()
            raise

    def _install_signal_handlers(self) -> None:
        """From here on Ctrl-C/SIGTERM/SIGHUP make madtrace restore and detach."""
        self._previous_handlers = self.controller.install_signal_handlers(launched=self.tracee.launched)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in getattr(self, "_previous_handlers", {}).items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

    def _create_output(self) -> None:
        store.create_trace_dir(self.options.output, self.options.force)
        self._created_output = True

    def _remove_output(self) -> None:
        """Nothing was traced: leave no empty trace directory behind."""
        if getattr(self, "_created_output", False):
            shutil.rmtree(self.options.output, ignore_errors=True)

    def _load_address_space(self) -> None:
        pid = self.tracee.pid
        self.address_space = AddressSpace.from_maps(
            read_maps(pid), self.tracee.mem.read, exe_path=os.readlink(f"/proc/{pid}/exe"), pid=pid)

    def module_summaries(self) -> list[dict]:
        space = self.address_space
        if space is None:
            return []
        counts = space.counts()
        return [dict(name=m.name, path=m.path, bias=m.bias, main=m.is_main, **counts[m.name])
                for m in space.modules]

    def _after_start(self) -> None:
        main = self.address_space.main if self.address_space else None
        if main is not None and main.image.stripped and not self._warned_stripped:
            self._warned_stripped = True
            self.log(f"{main.name} is stripped: only dynamic symbols and PLT entries are named")
        if self.options.trace_functions and self.tracee.exit_event is None:
            self._install_function_tracing()
        if self.options.data and self.tracee.exit_event is None:
            self._install_data_tracing(**data_selection(self.options, self.address_space))
        store.write_text(self.options.output, "maps.start.txt", self._program_maps())
        self.controller.on_thread_exit.append(self._snapshot_at_exit)
        self.controller.on_exec.append(self._on_exec)
        self.meta["pid"] = self.tracee.pid
        self.meta["start_time"] = time.time()
        if self.options.store:
            from .trace.store_writer import StoreWriter
            from .trace.store_writer import FINISH_AT_END_EVENTS
            self.store_writer = StoreWriter(self.options.output,
                                            accesses_possible=lambda: self.data is not None,
                                            defer_above=FINISH_AT_END_EVENTS)
            self.store_writer.start()

    def add_functions(self, patterns: list[str]) -> dict:
        """Instrument more functions of the live target (every thread stopped; the
        REPL and the daemon). Returns the report of this addition."""
        if self.functions is not None and self.functions.plan is not None:
            return self.functions.add(patterns)
        try:
            self._install_function_tracing(patterns)
        except BaseException:
            self.functions = None
            raise
        return self.functions.report

    def _install_function_tracing(self, patterns: list[str] | None = None) -> None:
        patterns = patterns or self.options.functions
        if not patterns and not self.address_space.main.image.functions():
            self.log(f"{self.address_space.main.name} has no function symbols: "
                     "function tracing is off (name functions with -f)")
            return
        try:
            engine = FunctionTracer(self.tracee, self.address_space, self.options.output,
                                    timestamps=self.options.timestamps, method=self.options.method)
            self.functions = engine
            started = time.perf_counter()
            report = engine.install(patterns or ["*"])
            report["install_seconds"] = round(time.perf_counter() - started, 3)
        except BaseException:
            if self.functions is not None:
                self.functions.detach()  # restores whatever was already patched
            raise
        self.tracee.on_new_thread.append(engine.register_thread)
        self.controller.on_thread_exit.append(lambda tracee, tid: engine.thread_exited(tid))
        self.controller.on_fork_child.append(lambda child, pid: engine.fork_child(child))
        self.controller.before_detach.append(lambda tracee: engine.detach())
        patched = report["patched"]
        sites = sum(p["sites"] for p in patched)
        methods = {m: sum(1 for p in patched if p["method"] == m) for m in ("callsite", "entry")}
        self.log(f"tracing {len(patched)} functions ({methods['callsite']} at their call sites, "
                 f"{methods['entry']} at their entry; {sites} patches"
                 f"{', %d skipped' % len(report['skipped']) if report['skipped'] else ''}) "
                 f"in {report['install_seconds']:.2f} s")
        for item in report["skipped"][:10]:
            self.log(f"not traced: {item['what']}: {item['why']}")
        if len(report["skipped"]) > 10:
            self.log(f"... {len(report['skipped']) - 10} more not traced: see the patch report "
                     f"(functions.json in the trace directory)")

    def _install_data_tracing(self, **selection) -> None:
        """``selection``: ``only_regions`` or ``region_filter`` (see DataEngine)."""
        functions = self.functions
        kind = self.options.data_engine
        if kind == "hybrid" and selection.get("data_in"):
            # rewritten code records wherever it runs: --data-in needs every access to stop
            kind = "fault"
            self.log("--data-in: the fault engine records the accesses (one stop each)")
        engine = DataEngine(self.tracee, self.address_space, self.options.output,
                            sequence_of=functions.sequence_of if functions else None,
                            sequence_address=functions.sequence_address if functions else None,
                            patched_addresses=set(functions.patches.applied) if functions else None,
                            defer=self.controller.deferred.extend,
                            track_allocations=self.options.track_allocations,
                            loads=self.options.loads, stores=self.options.stores,
                            original_address=self._original_addresses,
                            engine=kind,
                            rings=functions.rings if functions else None, **selection)
        self.data = engine
        try:
            engine.install()
        except BaseException:
            engine.detach()
            raise
        if engine.paths is None:
            # every access costs ptrace stops: ~10x cheaper with tracer and target on one CPU
            # (the hybrid engine's accesses do not stop: the target and the drain of its
            # rings run side by side)
            self._same_cpu = SameCpu(list(self.tracee.threads), pid=self.tracee.pid).__enter__()
            engine.numa.on_binding = self._same_cpu.set_original
        self.controller.signal_claimers.append(engine.claim_signal)
        self.controller.syscall_claimers.append(engine.claim_syscall)
        self.controller.on_fork_child.append(lambda child, pid: engine.fork_child(child))
        self.controller.on_vfork_start.append(engine.vfork.started)
        self.controller.on_vfork_done.append(engine.vfork.done)
        self.controller.on_thread_exit.append(lambda tracee, tid: engine.thread_exited(tid))
        self.controller.before_detach.append(lambda tracee: engine.detach())
        self.controller.before_detach.append(lambda tracee: self._unpin())
        self.log(f"tracing data accesses to {len(engine.regions.regions)} regions "
                 f"({len(engine.protected)} pages)")
        for warning in engine.warnings:
            self.log(warning)

    def _original_addresses(self, rips):
        """Instruction addresses as recorded: relocated prologue instructions
        (function tracing's entry trampolines) by their original address."""
        return self.functions.original_addresses(rips) if self.functions is not None else rips

    # live control (REPL / daemon), every thread stopped -------------------------
    def start_data_tracing(self, **selection) -> str:
        if self.data is not None:
            raise UsageError("data tracing was already on once in this session; "
                             "its results are kept (start a new session to trace again)")
        self._install_data_tracing(**selection)
        labels = ", ".join(r.label for r in self.data.regions.regions[:6])
        more = "..." if len(self.data.regions.regions) > 6 else ""
        return (f"data tracing on: {len(self.data.regions.regions)} regions ({labels}{more}), "
                f"{len(self.data.protected)} pages")

    def stop_data_tracing(self) -> str:
        if self.data is None or not self.data.active:
            raise UsageError("data tracing is not on")
        self.data.detach()
        self._unpin()
        return f"data tracing off after {self.data.faults} faults"

    def _unpin(self) -> None:
        if getattr(self, "_same_cpu", None) is not None:
            self._same_cpu.__exit__(None, None, None)
            self._same_cpu = None

    def _snapshot_at_exit(self, tracee: Tracee, tid: int) -> None:
        if tid == tracee.pid or len(tracee.threads) <= 1:
            self._maps_end = self._program_maps()

    def _program_maps(self) -> str:
        """/proc/PID/maps as the program sees it (the data engine's alias mappings
        under the names of what the program mapped there)."""
        text = read_maps_text(self.tracee.pid)
        alias = self.data.alias if self.data is not None else None
        return alias.maps_view(text) if alias is not None and alias.active else text

    def _on_exec(self, tracee: Tracee) -> None:
        if self.data is not None and self.data.active:
            self.data.forget_after_exec()
            self.log("the target called exec: data tracing ends with the old image")
        if self.functions is not None and self.functions.active:
            self.functions.forget_after_exec()
            self.log("the target called exec: function tracing ends with the old image")
        self.meta.setdefault("execs", []).append(
            open(f"/proc/{tracee.pid}/cmdline", "rb").read().split(b"\0")[0].decode(errors="replace"))
        self._load_address_space()

    # -------------------------------------------------------------- run
    def run(self) -> int | None:
        """Runs to the target's exit or to a stop request. Returns the target's exit
        code (128+N for death by signal N), or None when madtrace detached."""
        controller = self.controller
        controller.arm_duration(self.options.duration)
        try:
            outcome = controller.run()
        except BaseException:
            # never leave the target stopped or patched because the tracer failed
            try:
                controller.detach_all()
            finally:
                self.finish("tracer-error")
            raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._restore_signal_handlers()
        if outcome == "detached":
            self._maps_end = self._maps_end or self._program_maps()
            self.log(f"detached from process {self.tracee.pid} ({controller.stop_reason})")
        return self.finish(outcome)

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
                                     patch_report=engine.report),
        }

    def _data_results(self) -> dict:
        """Writes the data files (data/) into the trace directory; returns the counts."""
        engine = self.data
        if engine is None:
            return {"accesses": {}}
        engine.write()
        loop = engine.loop_stats()
        return {"accesses": engine.access_counts(),
                "data_tracing": {"faults": engine.faults,
                                 "untraced_faults": loop["untraced"] + engine.untraced_faults,
                                 "fast_path": loop["fast"], "slow_path": engine.slow,
                                 "slow_reasons": dict(engine.slow_reasons),
                                 "store_writebacks": loop["writebacks"],
                                 "store_writeback_errors": loop["writeback_errors"],
                                 "syscalls_resumed_natively": loop["syscalls"],
                                 "mapped_regions": engine.syscalls.mapped_regions,
                                 "allocations": len(engine.alloc.blocks) if engine.alloc else 0,
                                 # allocator calls other threads made while a breakpoint was
                                 # stepped over: those calls may be missing
                                 "allocation_windows": engine.alloc.missed_windows if engine.alloc else 0,
                                 "freed_accesses": engine.freed_accesses,
                                 "stubs": len(engine.area.stubs) if engine.area else 0,
                                 "syscalls_opened": engine.syscalls.opened,
                                 "syscalls_redirected": engine.syscalls.redirected_calls,
                                 "open_windows": engine.syscalls.open_windows + engine.blocks.open_windows,
                                 "block_events": engine.blocks.counts(),
                                 "gate": {"functions": engine.gate.names,
                                          "entries": engine.gate.entries,
                                          "arms": engine.gate.arms} if engine.gate else None,
                                 "guard": {"installed": engine.guard.installed if engine.guard else False,
                                           "reinstalls": engine.guard.reinstalls if engine.guard else 0},
                                 "held_stops": engine.held_stops,
                                 # vfork children that ran untraced in the shared memory
                                 "vfork_windows": engine.vfork.windows,
                                 "regions": [[r.start, r.end, r.label] for r in engine.regions.regions],
                                 "engine": engine.engine_kind,
                                 "paths": engine.paths.report() if engine.paths else None,
                                 "alias": engine.alias.report() if engine.alias else None}}

    def _state_meta(self, outcome: str) -> dict:
        """How the recording stands (or ended): the part of meta.json that the end
        of the recording and a snapshot share."""
        status = exit_code_of(self.tracee.exit_event) if self.tracee else None
        modules = self.module_summaries()
        return dict(
            outcome=outcome,
            stop_reason=self.controller.stop_reason if self.controller else None,
            exit_status=status,
            exit_signal=self.tracee.exit_event.signum
            if self.tracee and isinstance(self.tracee.exit_event, ThreadKilled) else None,
            threads=self.tracee.threads_seen if self.tracee else 0,
            end_time=time.time(),
            forks=self.controller.forks_seen if self.controller else 0,
            signals_forwarded=self.controller.signals_forwarded if self.controller else 0,
            modules=modules,
            symbols=sum(m["symbols"] for m in modules),
        )

    def finish(self, outcome: str) -> int | None:
        self._unpin()
        self.meta.update(self._state_meta(outcome))
        self.meta.update(self._function_results(final=True))
        self.meta.update(self._data_results())
        if self._maps_end:
            store.write_text(self.options.output, "maps.end.txt", self._maps_end)
        store.write_meta(self.options.output, self.meta)
        self._finish_store()
        return self.meta["exit_status"]

    def _finish_store(self) -> None:
        """The rest of DIR/store (progress on stderr when it takes long).  A
        failure leaves the store incomplete: it is then built on first use."""
        writer, self.store_writer = self.store_writer, None
        if writer is None:
            return
        try:
            writer.finish(None if self.options.quiet else sys.stderr)
        except Exception as exc:   # the trace itself is written: say so, go on
            self.log(f"the store was not written ({type(exc).__name__}: {exc}); "
                     "it is built when a query, export or report needs it")

    # live control: the trace so far, the target still running ---------------------
    def snapshot(self, directory: str, force: bool = False) -> dict:
        """Write the trace directory of the recording so far to ``directory`` (what
        the end of the recording writes, with outcome "snapshot" and the memory
        map of now as maps.end.txt) while the target keeps running.  Tracer
        thread only (the data engine's buffers are its own); never overwrites an
        existing path without ``force``.  Returns where and what was written."""
        live = os.path.realpath(self.options.output)
        wanted = os.path.realpath(directory)
        if wanted == live or wanted.startswith(live + os.sep) or live.startswith(wanted + os.sep):
            raise UsageError(f"{directory} is (or contains, or is inside) the trace directory of "
                             f"this session ({self.options.output}): save to another directory")
        store.create_trace_dir(directory, force)
        try:
            meta = dict(self.meta, **self._state_meta("snapshot"), snapshot_of=live)
            meta.update(self._data_results())           # data/ of the live directory, now
            rings = self.functions.rings if self.functions is not None else None
            with rings.quiesced() if rings is not None else contextlib.nullcontext():
                # the record files as they are (draining waits only for this)
                meta.update(self._function_results(final=False))
                sizes = store.record_file_sizes(self.options.output)
            store.copy_trace_files(self.options.output, directory, sizes)
            if self.functions is not None and rings is not None:
                # the calls of the records copied (the threads' own counters went on)
                meta["calls"] = self.functions.call_counts(entry_counts(directory, rings.sites))
            store.write_text(directory, "maps.end.txt", self._program_maps())
            store.write_meta(directory, meta)
            if self.options.store:
                from .trace.store_writer import build_store
                build_store(directory, None if self.options.quiet else sys.stderr)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return {"directory": directory, "calls": meta["calls"], "records":
                meta.get("function_tracing", {}).get("records", 0),
                "accesses": sum(c["L"] + c["S"] for c in meta["accesses"].values()),
                "dropped_events": meta["dropped_events"], "threads": meta["threads"]}
