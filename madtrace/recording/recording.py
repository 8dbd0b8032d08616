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

from ..binary import dwarf_cache
from ..binary.dwarf_prefetch import Prefetch
from ..cache import disk
from ..progress import Activity
from .status_line import StatusLine
from ..binary.address_space import AddressSpace
from ..data.choices import DataChoices, FunctionTracingLinks
from ..data.engine import DataEngine
from ..data.regions import Region, region_matcher
from ..calls.engine import FunctionTracer
from ..calls.entry_links import EntryLinks
from ..target.loader_watch import LoaderWatch
from ..calls.plan import split_patterns
from .mappings import CleanSlate
from .results import Results
from .images import ImageChanges, parent_of, read_cmdline
from .crashes import CrashReports
from .forks import ForkChildren
from ..binary.maps import read_maps
from ..errors import MadtraceError, StrippedBinaryError, UnknownSymbolError, UsageError
from ..target.areas import MAPS_PREFIX
from ..flight.session import FlightSession, flight_session
from ..process.controller import Controller
from ..process.cpu import SameCpu
from ..process.entry_start import EntryStart
from ..process.events import ThreadExited, ThreadKilled
from ..process.tracee import Tracee, check_traceable, resolve_command
from ..trace import store
from ..trace.format import MAPS_END_FILE
from ..trace.meta import write_meta
from ..trace.reader import entry_counts


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
    store: bool = False              # build DIR/store when the target ends (store_writer.py)
    data_engine: str = "hybrid"      # hybrid (alias + rewritten code) or fault (a stop per access)
    copy_after: int | None = None    # hybrid: a function is copied after N faults (None: default)
    max_bytes: int | None = None     # --max-size: stop recording once the trace holds this
    # a flight recorder (flight/): the last flight_bytes (or keep_seconds) kept in memory,
    # written to DIR/snapshot.N on a trigger (flight/triggers.py Trigger), the last
    # ``snapshots`` kept
    flight_bytes: int | None = None
    keep_seconds: float | None = None
    triggers: list = field(default_factory=list)
    snapshots: int | None = None


BLOCK_NAME = re.compile(r"^<?(?:malloc|calloc|realloc|freed:)?(\d+)(?:@.*)?>?$")


def data_selection(options: RecordOptions, space: AddressSpace) -> dict:
    """DataChoices keywords for --regions, --only and --data-in."""
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
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return ""


class Recording(ImageChanges, CleanSlate, Results):
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
        self.crashes: CrashReports | None = None     # from the start (_after_start)
        # shared by the two engines of the image traced now (calls/entry_links.py)
        self.entry_links = EntryLinks()
        # the directory of the image traced now: options.output, then DIR/exec.N after
        # the Nth exec (each image of the process gets a whole trace directory)
        self.output = options.output
        self.images: list[dict] = []         # the images before this one (exec), in order
        # -f patterns: those that matched a function in some image so far, and those
        # waiting for an exec or a dlopen to bring a module that defines them
        self.matched_functions: set[str] = set()
        self.pending_functions: list[str] = []
        self._image_hooks: list[tuple[list, object]] = []   # (hook list, hook) of this image
        self._entry_start: EntryStart | None = None
        self._loader_watch: LoaderWatch | None = None   # while -f patterns are pending
        self.forks: ForkChildren | None = None    # --follow-forks: the children's recordings
        self.leftovers_line = ""             # what an earlier session left, found at attach
        self._engine_ahead: FunctionTracer | None = None   # made by prepare_functions
        self.defer_while_stopped = False     # live sessions: see ``after_commands``
        self.prefetches: list[Prefetch] = []   # DWARF read while the target runs
        # called once function tracing is installed in an image (every thread stopped;
        # at an exec's entry or a dlopen too): a live session's ring pool starts
        self.on_functions_installed: list = []
        # attached by a daemon: -f (or every function) left to the live session
        self.functions_after_attach = False
        self.attach_patterns: list[str] = []
        self.symbols_seconds = 0.0      # reading the modules' symbols (ELF)
        # --flight: the recording goes to the flight recorder's scratch directory and
        # options.output holds its snapshots (flight/session.py)
        self.flight: FlightSession | None = None
        disk.notify = self.log      # a corrupt cache entry rebuilt: one line, not under -q
        dwarf_cache.progress_out = None if options.quiet else sys.stderr

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
            self._make_controller()
            self.controller.run_to_entry()
            if self.controller.never_set_fs:
                self.meta["untraced"] = ("a static executable that never set its thread pointer "
                                         "(arch_prctl ARCH_SET_FS), which madtrace's stubs need")
                self.log(f"not traced: {self.meta['untraced']}; it ran to its end")
            if self.tracee.exit_event is None:
                self._load_address_space()
                if self.options.start_at == "main":
                    self.controller.run_to(self._main_address())
            self._after_start()
        except BaseException:
            self.tracee.kill()  # a launch that failed to start must not run untraced
            self._remove_output()
            raise

    def start_in_child(self, child: Tracee, controller: Controller) -> None:
        """--follow-forks: record a fork child like the parent, with engines of its own
        (the parent's were undone in it), before it runs (recording/forks.py)."""
        self._create_output()
        self.tracee, self.controller = child, controller
        self.meta.update(mode="fork", command=read_cmdline(child.pid), parent=parent_of(child.pid))
        self._register_release()
        self._load_address_space()
        self._after_start()

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
        ahead = self._space_ahead(pid)
        if ahead is not None and self.options.trace_functions and self.options.functions:
            self._engine_ahead = self._new_engine(None, ahead[1])   # its tracee once seized
        try:
            self.tracee = Tracee.attach(pid)
        except BaseException:
            self._remove_output()
            raise
        self._make_controller()
        self.controller.settle_attach()
        try:
            self.meta["command"] = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:-1]
            self.meta["command"] = [a.decode(errors="replace") for a in self.meta["command"]]
        except OSError:
            pass
        try:
            self._load_address_space(ahead)
            self._recover_leftovers()
            self._after_start()
        except BaseException:
            self.tracee.detach()
            self._remove_output()
            raise

    def _make_controller(self) -> None:
        self.controller = Controller(self.tracee, follow_forks=self.options.follow_forks)
        if self.options.follow_forks:
            self.forks = ForkChildren(self)
        self._register_release()
        self._install_signal_handlers()

    def _register_release(self) -> None:
        """madtrace's mappings come out of this process at detach, and out of the
        copies its fork children get (recording/mappings.py)."""
        self.hooks.release.append(self._release_areas)
        self.hooks.release_in_child.append(self._release_in_child)

    def _install_signal_handlers(self) -> None:
        """From here on Ctrl-C/SIGTERM/SIGHUP make madtrace restore and detach."""
        self._previous_handlers = self.controller.install_signal_handlers(launched=self.tracee.launched)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in getattr(self, "_previous_handlers", {}).items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

    @property
    def hooks(self):
        """The controller's hooks for this recording's process."""
        return self.controller.hooks(self.tracee)

    def _image_hook(self, hooks: list, hook) -> None:
        """Add ``hook`` to one of the controller's lists for the image traced now
        (taken out again when the image ends: at exec)."""
        hooks.append(hook)
        self._image_hooks.append((hooks, hook))

    def _create_output(self) -> None:
        if self.flight is None:
            if self.options.follow_forks and (self.options.flight_bytes or self.options.keep_seconds):
                raise UsageError("--follow-forks and --flight do not go together yet")
            self.flight = flight_session(self)
        if self.flight is not None:
            try:
                self.flight.create_folder(self.options.force)
            except BaseException:
                self.flight.recorder.close()
                self.flight = None
                raise
            self.output = self.flight.scratch
        else:
            store.create_trace_dir(self.options.output, self.options.force)
        self._created_output = True

    @property
    def trace_root(self) -> str:
        """The first image's trace directory (an exec's are inside it): DIR, or the
        flight recorder's scratch directory (DIR then holds its snapshots)."""
        return self.flight.scratch if self.flight is not None else self.options.output

    def _remove_output(self) -> None:
        """Nothing was traced: leave no empty trace directory behind."""
        if getattr(self, "_created_output", False):
            shutil.rmtree(self.options.output, ignore_errors=True)
            if self.flight is not None:
                self.flight.recorder.close()

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
        self._start_image()
        self.hooks.on_thread_exit.append(self._snapshot_at_exit)
        self.hooks.on_exec.append(self._on_exec)
        if self.flight is not None:
            self.hooks.before_forward_signal.append(self.flight.before_forward_signal)
        self.crashes = CrashReports(
            self._madtrace_code, self._symbolize, self.log,
            lambda address: self.data.page_note(address) if self.data is not None else None)
        self.hooks.signal_claimers.insert(0, self.crashes.first_look)
        self.hooks.before_forward_signal.append(self.crashes.before_forward)

    def _start_image(self) -> None:
        """Install the engines in the image traced now (at launch, attach, or the entry
        of an image exec'd since) and start its store writer."""
        if self.options.trace_functions and self.tracee.exit_event is None:
            self._install_function_tracing()
            if self.pending_functions:
                self._watch_loader()
        if self.options.data and self.tracee.exit_event is None:
            # launched, the image has not run yet: what earlier runs relocated can be laid
            # out before it does (not at an attach: its threads are anywhere)
            self._install_data_tracing(before_the_program=self.tracee.launched,
                                       **data_selection(self.options, self.address_space))
        self._write_start_files()

    def after_commands(self) -> None:
        """Live sessions, the target running again: what the commands deferred."""
        if self.functions is not None:
            self.functions.after_stop()

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

    def _new_engine(self, tracee, space) -> FunctionTracer:
        return FunctionTracer(tracee, space, self.output, timestamps=self.options.timestamps,
                              method=self.options.method, links=self.entry_links)

    def _install_function_tracing(self, patterns: list[str] | None = None) -> None:
        """``patterns``: a live addition (errors at once); None: the -f patterns, of
        which those matching nothing yet wait for an exec or a dlopen."""
        at_start = patterns is None
        if patterns is None and self.options.functions:
            patterns, self.pending_functions = split_patterns(self.address_space,
                                                              self.options.functions)
            self.matched_functions.update(patterns)
            if self.pending_functions:
                self.log(f"-f {', '.join(map(repr, self.pending_functions))}: no such function in "
                         f"{self.address_space.main.name} or its libraries yet; pending until "
                         f"an exec or a dlopen brings one")
            if not patterns:
                return
        if not patterns and not self.address_space.main.image.functions():
            self.log(f"{self.address_space.main.name} has no function symbols: "
                     "function tracing is off (name functions with -f)")
            return
        if at_start and self.functions_after_attach and not self.tracee.launched \
                and not self.options.data:
            # a daemon's attach: its live session instruments them once the target runs
            # again, in short stops (calls/staging.py), not in the attach's stop
            self.functions_after_attach, self.attach_patterns = False, patterns or ["*"]
            return
        try:
            engine, self._engine_ahead = self._engine_ahead, None
            if engine is None or engine.space is not self.address_space:
                engine = self._new_engine(self.tracee, self.address_space)
            engine.tracee = self.tracee
            engine.defer_tables = self.defer_while_stopped
            self.functions = engine
            started = time.perf_counter()
            report = engine.install(patterns or ["*"])
            report["install_seconds"] = round(time.perf_counter() - started, 3)
            if not self.tracee.launched:        # what waits for the target to run again
                if not self.controller.running:
                    self.controller.after_resume.append(engine.after_stop)
                elif not self.defer_while_stopped:      # (a live session's after_commands)
                    engine.after_stop()
        except BaseException:
            if self.functions is not None:
                self.functions.detach()  # restores whatever was already patched
            raise
        engine.rings.on_failure = lambda exc: self.log(
            f"{exc}: recording stops here (calls, and the hybrid engine's accesses); the program goes on")
        self._image_hook(self.tracee.on_new_thread, engine.register_thread)
        self._image_hook(self.hooks.on_thread_exit, lambda tracee, tid: engine.thread_exited(tid))
        self._image_hook(self.hooks.on_fork_child, lambda child, pid: engine.fork_child(child))
        self._image_hook(self.hooks.before_detach, lambda tracee: engine.detach())
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
        for hook in self.on_functions_installed:
            hook()

    def _install_data_tracing(self, before_the_program: bool = False, **selection) -> None:
        """``selection``: ``only_regions`` or ``region_filter`` (see DataChoices);
        ``before_the_program``: at a launched image's entry point (the warm start)."""
        functions = self.functions
        kind = self.options.data_engine
        if kind == "hybrid" and selection.get("data_in"):
            # rewritten code records wherever it runs: --data-in needs every access to stop
            kind = "fault"
            self.log("data tracing inside chosen functions: the fault engine records the "
                     "accesses (one stop each)")
        choices = DataChoices(engine=kind, track_allocations=self.options.track_allocations,
                              loads=self.options.loads, stores=self.options.stores, **selection)
        links = FunctionTracingLinks(
            sequence_of=functions.sequence_of if functions else None,
            sequence_address=functions.sequence_address if functions else None,
            patched_addresses=self.entry_patched(), original_address=self._original_addresses,
            rings=functions.rings if functions else None, entry_links=self.entry_links,
            original_return=functions.original_return if functions else None)
        engine = DataEngine(self.tracee, self.address_space, self.output, choices, links,
                            defer=self.controller.deferred.extend)
        if self.options.copy_after is not None:
            engine.copy_after = self.options.copy_after
        engine.warm_start = before_the_program
        self.data = engine
        # the accesses are named with DWARF: the binaries seen for the first time are
        # read now, while the target runs (a child process each), not at the write-out
        self.prefetches.append(Prefetch(m.image for m in self.address_space.modules).start())
        try:
            engine.install()        # a failure takes back what it did
        except BaseException:
            self.data = None        # the session as it was: data tracing can be asked again
            for warning in engine.warnings:
                self.log(warning)
            raise
        if engine.paths is None:
            # every access costs ptrace stops: ~10x cheaper with tracer and target on one CPU
            # (the hybrid engine's accesses do not stop: the target and the drain of its
            # rings run side by side)
            self._same_cpu = SameCpu(list(self.tracee.threads), pid=self.tracee.pid).__enter__()
            engine.numa.on_binding = self._same_cpu.set_original
        hooks = self.hooks
        self._image_hook(hooks.signal_claimers, engine.claim_signal)
        self._image_hook(hooks.syscall_claimers, engine.claim_syscall)
        self._image_hook(hooks.on_fork_child, lambda child, pid: engine.fork_child(child))
        self._image_hook(hooks.on_vfork_start, engine.vfork.started)
        self._image_hook(hooks.on_vfork_done, engine.vfork.done)
        self._image_hook(hooks.on_thread_exit, lambda tracee, tid: engine.thread_exited(tid))
        self._image_hook(hooks.before_detach, lambda tracee: engine.detach())
        self._image_hook(hooks.before_detach, lambda tracee: self._unpin())
        self.log(f"tracing data accesses to {len(engine.regions.regions)} regions "
                 f"({len(engine.protected)} pages)")
        for warning in engine.warnings:
            self.log(warning)

    def entry_patched(self) -> set[int]:
        """The functions function tracing patches at their entry (their addresses)."""
        return set(self.functions.patches.applied) if self.functions is not None else set()

    def _original_addresses(self, rips):
        """Instruction addresses as recorded: relocated prologue instructions
        (function tracing's entry trampolines) by their original address."""
        return self.functions.original_addresses(rips) if self.functions is not None else rips

    # live control (REPL / daemon), every thread stopped -------------------------
    def start_data_tracing(self, **selection) -> str:
        if self.data is not None and self.data.active:
            raise UsageError("data tracing is on already ('trace data off' ends it)")
        if self.data is not None:
            raise UsageError("data tracing was on once in this session, and a session traces "
                             "data once: its results are kept (start a new session to trace "
                             "again)")
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

    def _madtrace_code(self, address: int) -> str | None:
        """What of madtrace's holds code ``address`` (crashes.py): a copy of one of
        the program's functions (the data engine's), another of its areas, or
        None (the program's own code)."""
        paths = self.data.paths if self.data is not None else None
        rewriter = paths.rewriter if paths is not None else None
        copy = rewriter.copy_at(address) if rewriter is not None else None
        if copy is not None:
            original = copy.original_of(address)
            probe = copy.probe_at(address)
            what = f"in madtrace's copy of {self._symbolize(copy.start)}"
            if original is not None:
                what += f", at the copy of {self._symbolize(original)}"
            return what + (" (its data probe)" if probe is not None else "")
        try:
            for m in read_maps(self.tracee.pid):
                if m.start <= address < m.end:
                    return f"in madtrace's {m.path}" if m.path.startswith(MAPS_PREFIX) else None
        except MadtraceError:
            pass
        return None

    def _symbolize(self, address: int) -> str:
        space = self.address_space
        return space.symbolize(address) if space is not None else f"{address:#x}"

    def _snapshot_at_exit(self, tracee: Tracee, tid: int) -> None:
        if tid == tracee.pid or len(tracee.threads) <= 1:
            self._maps_end = self._program_maps()

    def _program_maps(self) -> str:
        """/proc/PID/maps as the program sees it (the data engine's alias mappings
        under the names of what the program mapped there)."""
        text = read_maps_text(self.tracee.pid)
        alias = self.data.alias if self.data is not None else None
        return alias.maps_view(text) if alias is not None and alias.active else text

    # -------------------------------------------------------------- run
    def run(self, status_line: bool = True) -> int | None:
        """Runs to the target's exit or to a stop request. Returns the target's exit
        code (128+N for death by signal N), or None when madtrace detached.
        ``status_line``: what it is doing on a terminal (status_line.py; not under a
        REPL or a daemon, whose terminal is theirs)."""
        controller = self.controller
        flight = self.flight
        controller.arm_bounds(self.options.duration, self.options.max_bytes, self.bytes_written,
                              periodic=flight.tick if flight is not None else None)
        if flight is not None:
            self._previous_handlers[signal.SIGUSR1] = signal.signal(signal.SIGUSR1,
                                                                    flight.signal_to_tracer)
        try:
            shown = status_line and not self.options.quiet
            with StatusLine(self.live_counts, sys.stderr if shown else None):
                outcome = controller.run()
        except BaseException:
            # never leave the target stopped or patched because the tracer failed
            try:
                controller.detach_all()
            finally:
                try:
                    self.finish("tracer-error")
                except Exception:
                    pass    # what is on disk stays readable (outcome "running": partial)
            raise           # the first error is the one to report
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._restore_signal_handlers()
        if outcome == "detached":
            self._maps_end = self._maps_end or self._program_maps()
            if controller.stop_reason == "max-size":
                self.log(f"the trace reached --max-size ({self.bytes_written() / 1e6:.1f} MB): "
                         f"detached from process {self.tracee.pid}, which runs on untraced")
            else:
                self.log(f"detached from process {self.tracee.pid} ({controller.stop_reason})")
        return self.finish(outcome)

    def bytes_written(self) -> int:
        """The bytes of the trace directory's files so far (--max-size)."""
        total = 0
        for folder, _dirs, files in os.walk(self.output):
            for name in files:
                try:
                    total += os.stat(os.path.join(folder, name)).st_size
                except OSError:
                    continue    # a file replaced as it was read
        return total

    def live_counts(self) -> dict[str, int]:
        """The status line's counters (status_line.py), read on its thread."""
        counts: dict[str, int] = {}
        rings = self.functions.rings if self.functions is not None else None
        if rings is not None:
            counts["call_records"] = sum(list(rings.records_per_thread.values()))
            totals = rings.totals()
            counts["dropped"] = totals["dropped"] + totals["unregistered_records"]
        if self.data is not None:
            data = self.data.live_counts()
            counts["dropped"] = counts.get("dropped", 0) + data.pop("dropped", 0)
            counts.update(data)
        return counts

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
            **({"faults_delivered": self.crashes.reports}
               if self.crashes is not None and self.crashes.reports else {}),
            modules=modules,
            symbols=sum(m["symbols"] for m in modules),
        )

    def finish(self, outcome: str) -> int | None:
        started = time.monotonic()
        self._unpin()
        self.after_commands()
        if self._entry_start is not None:
            self._entry_start.disarm()
        self.meta.update(self._state_meta(outcome), **self._detach_results())
        out = None if self.options.quiet else sys.stderr
        with Activity("writing the trace", out):
            self.meta.update(self._function_results(final=True))
            self.meta.update(self._data_results())
            if self.forks is not None:
                self.meta["processes"] = self.forks.finish(outcome)
            never = [p for p in self.options.functions if p not in self.matched_functions]
            if never:
                self.meta["unmatched_functions"] = never
            if self._maps_end:
                store.write_text(self.output, MAPS_END_FILE, self._maps_end)
            failure = self._output_failure()
            if failure is not None:
                self.meta["output_error"] = str(failure)
            if self.images:
                self.meta["image"] = len(self.images)
                self._write_images_index()
            write_meta(self.output, self.meta)
            if failure is not None:
                raise failure       # after writing what could be written
        if self.data is not None:
            # the debug info read while the target ran names the accesses: read to the
            # end and cached now, not again by the summary or the first query
            self._wait_for_dwarf(out)
        self._finish_store()
        self.meta["tracer"] = self.tracer_stats(time.monotonic() - started)
        write_meta(self.output, self.meta)
        if self.flight is not None:
            self.flight.end()
        return self.meta["exit_status"]

    # live control: the trace so far, the target still running ---------------------
    def snapshot(self, directory: str, force: bool = False, flight_reason: str = "save") -> dict:
        """Write the trace directory of the recording so far to ``directory`` (what
        the end of the recording writes, with outcome "snapshot" and the memory
        map of now as maps.end.txt) while the target keeps running.  Tracer
        thread only (the data engine's buffers are its own); never overwrites an
        existing path without ``force``.  Returns where and what was written.
        A flight recorder's snapshot holds its window (flight/session.py),
        ``flight_reason`` its trigger."""
        self.after_commands()
        live = os.path.realpath(self.output)
        wanted = os.path.realpath(directory)
        if wanted == live or wanted.startswith(live + os.sep) or live.startswith(wanted + os.sep):
            raise UsageError(f"{directory} is (or contains, or is inside) the trace directory of "
                             f"this session ({self.output}): save to another directory")
        store.create_trace_dir(directory, force)
        try:
            meta = dict(self.meta, **self._state_meta("snapshot"), snapshot_of=live)
            meta.update(self._data_results())           # data/ of the live directory, now
            rings = self.functions.rings if self.functions is not None else None
            with rings.quiesced() if rings is not None else contextlib.nullcontext():
                # the record files as they are (draining waits only for this)
                meta.update(self._function_results(final=False))
                sizes = store.record_file_sizes(self.output)
            if self.flight is not None:
                self.flight.window_into(directory, meta, flight_reason)
            else:
                store.copy_trace_files(self.output, directory, sizes)
            if self.functions is not None and rings is not None:
                # the calls of the records copied (the threads' own counters went on)
                meta["calls"] = self.functions.call_counts(entry_counts(directory, rings.sites))
            store.write_text(directory, MAPS_END_FILE, self._program_maps())
            write_meta(directory, meta)
            if self.options.store:
                from ..trace.store_writer import build_store
                build_store(directory, None if self.options.quiet else sys.stderr)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return {"directory": directory, "calls": meta["calls"], "records":
                meta.get("function_tracing", {}).get("records", 0),
                "accesses": sum(c["L"] + c["S"] for c in meta["accesses"].values()),
                "dropped_events": meta["dropped_events"], "threads": meta["threads"],
                **({"flight": meta["flight"]} if "flight" in meta else {})}
