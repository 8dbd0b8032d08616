# SPDX-License-Identifier: GPL-2.0-or-later
"""The tracer thread's side of an interactive session.

ptrace requests must all come from the thread that attached, so a front end
(the REPL thread, a daemon's socket server) never touches the target: it
``submit``s an ``Invocation`` and waits for the ``Reply``.  The run loop
calls ``poll`` between its event polls (``Controller.command_poll``); at
that safe point queued commands run, every thread stopped first when one of
them needs it (``stops_target``), and the target resumes afterwards: the
stop events are then handled as the run loop would have (signals forwarded
unchanged, forks, exits...).  When the recording ends, ``end`` answers the
commands waiting for it (detach, kill) and refuses the rest.
"""

from __future__ import annotations

import collections
import queue
import shlex
import threading
import time
from concurrent.futures import Future

from ..data.regions import default_regions
from ..errors import MadtraceError, NoSuchProcessError
from ..process.events import ThreadKilled
from ..process.remote_syscall import RemoteSyscalls
from .parser import Invocation, parse
from .reply import Reply
from .registry import WAIT_FOR_END

STOP_WINDOWS = 32          # the stops status reports (stop_windows)

INTERNAL_ERROR = 70


def failure(exc: BaseException) -> Reply:
    if isinstance(exc, MadtraceError):
        return Reply(False, error=str(exc), code=exc.exit_code)
    return Reply(False, error=f"internal error: {type(exc).__name__}: {exc}", code=INTERNAL_ERROR)


def end_message(recording, status: int | None) -> str:
    tracee = recording.tracee
    where = f"trace written to {recording.options.output}"
    if recording.flight is not None:
        taken = len(recording.flight.recorder.taken)
        where = f"{taken} flight recorder snapshot{'s' * (taken != 1)} in {recording.options.output}"
    if status is None:
        reason = recording.controller.stop_reason if recording.controller else None
        return f"detached from process {tracee.pid} ({reason}){_kept(recording)}; {where}"
    if isinstance(tracee.exit_event, ThreadKilled):
        return f"process {tracee.pid} was killed by signal {tracee.exit_event.signum}; {where}"
    return f"process {tracee.pid} exited with status {status}; {where}"


def _kept(recording) -> str:
    """What the detach had to leave in the process, said where the user typed
    the command that ended the session (not only in the daemon's log)."""
    kept = (recording.meta.get("released") or {}).get("kept") or []
    if not kept:
        return ""
    size = sum(k["bytes"] for k in kept) / 1048576
    return (f"; left {len(kept)} of madtrace's mappings ({size:.1f} MiB) in it, still needed: "
            f"{kept[0]['why']}")


class LiveSession:
    def __init__(self, recording):
        self.recording = recording
        self.scratch: dict = {"start": time.monotonic()}   # per-command state (top)
        self.on_end: list = []           # callables(message), run in the tracer thread
        self.before_end_replies: list = []  # callables(), run before the session's last replies
        self.ended_message: str | None = None
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._waiting_for_end: list[Future] = []
        self._names: dict[str, list[str]] = {"functions": [], "variables": [], "modules": [],
                                             "regions": []}
        self.last_pause = 0.0            # s: the longest stop of the last command batch
        self.last_stops: list[float] = []   # s: each stop of that batch
        self._stops: list[float] = []
        # (start, end) of the last stops, perf_counter (CLOCK_MONOTONIC: the
        # target's own clock), oldest first (status: stop_windows)
        self.stop_windows: collections.deque = collections.deque(maxlen=STOP_WINDOWS)
        self.alone = False               # the command prepared is alone in its batch
        self._held: list = []            # queued commands left for the next batch
        if recording.controller.running:
            self._refresh_names()
        else:                            # not while the target waits (0.5 ms of its pause)
            recording.controller.after_resume.append(self._refresh_names)
        recording.controller.command_poll = self.poll
        recording.defer_while_stopped = True
        if recording.functions is not None:
            recording.functions.defer_tables = True
        recording.hooks.on_exec.append(lambda tracee: self._refresh_names())
        recording.on_functions_installed.append(self._functions_installed)
        self._functions_installed()         # the target is stopped (attached, not run yet)
        self._instrument_attach_patterns()

    def _instrument_attach_patterns(self) -> None:
        """A daemon's -f (or every function), left by the attach (Recording.
        attach_patterns): the first command, run once the target runs again, as
        ``instrument`` is (its stops short: calls/staging.py); a failure is logged."""
        patterns, self.recording.attach_patterns = self.recording.attach_patterns, []
        if not patterns:
            return
        if self.tracee.call_page is None and not self.controller.running:
            try:            # the call page: made in the attach's stop, not in the first
                with RemoteSyscalls(self.tracee):           # of the instrument's (4 calls)
                    pass
            except MadtraceError:
                pass        # (no thread can run a call now: made in that stop after all)
            self._follow_clones_if_needed()     # the page is madtrace's: until the pool is on
        future: Future = Future()
        future.add_done_callback(lambda done: done.result().ok or self.recording.log(
            f"functions not instrumented: {done.result().error}"))

        def queue_it():         # (parsing imports every command: not while the target waits)
            self._queue.put((parse(shlex.join(["instrument", *patterns])), future))
            self.controller.wake()
        if self.controller.running:
            queue_it()
        else:
            self.controller.after_resume.append(queue_it)

    # ------------------------------------------------------------ state
    @property
    def tracee(self):
        return self.recording.tracee

    @property
    def controller(self):
        return self.recording.controller

    @property
    def space(self):
        return self.recording.address_space

    @property
    def functions(self):
        """The FunctionTracer, or None before the first ``instrument``."""
        engine = self.recording.functions
        return engine if engine is not None and engine.plan is not None else None

    @property
    def pid(self) -> int:
        return self.tracee.pid

    def request_stop(self, reason: str) -> None:
        """Tracer thread only: the run loop detaches when the command is done."""
        self.controller.request_stop(reason)

    def stop_soon(self, reason: str) -> None:
        """Any thread (no ptrace request): the polling run loop sees it within ms."""
        if self.controller.stop_reason is None:
            self.controller.stop_reason = reason
        self.controller.wake()

    def traced_functions(self, patched_only: bool = False) -> list:
        engine = self.functions
        if engine is None:
            return []
        return [fn for fn in list(engine.plan.functions) if fn.method != "skipped"
                and (not patched_only or fn.fid in engine.patches_of)]

    # ------------------------------------------------------- completion
    def _refresh_names(self) -> None:
        space = self.space
        main = space.main if space is not None else None
        symbols = main.image.symbols if main is not None else []
        regions = [r.label for r in default_regions(space, [], opt_in=True)] if space is not None else []
        self._names = {
            "functions": sorted({s.name for s in symbols if s.kind in ("FUNC", "IFUNC")}),
            "variables": sorted({s.name for s in symbols if s.kind in ("OBJECT", "COMMON")}),
            "modules": sorted(m.name for m in space.modules) if space is not None else [],
            "regions": [shlex.quote(label) for label in regions + ["[heap]"]],
        }

    def complete(self, kind: str | None, word: str) -> list[str]:
        """Candidates for an argument being typed (called from the front end's thread:
        reads snapshots only, never the target)."""
        names = self._names
        if kind in ("functions", "symbols") and ":" in word:
            scope = word.split(":", 1)[0]
            module = self.space.module_named(scope) if self.space else None
            if module is None:
                return []
            found = {s.name for s in module.image.symbols if s.kind in ("FUNC", "IFUNC")}
            return [f"{scope}:{n}" for n in sorted(found)]
        if kind == "functions":
            return names["functions"] + [f"{m}:" for m in names["modules"]]
        if kind == "symbols":
            return names["functions"] + names["variables"]
        if kind in ("variables", "regions"):
            return names[kind]
        if kind == "traced":
            return sorted(fn.name for fn in self.traced_functions(patched_only=True)) + ["all"]
        if kind == "threads":
            return [str(t) for t in sorted(list(self.tracee.threads))]
        return []

    # ---------------------------------------------------- any thread
    def submit(self, invocation: Invocation) -> Reply:
        """Run a tracer command at the next safe point and wait for its reply."""
        future: Future = Future()
        with self._lock:
            if self.ended_message is not None:
                return Reply(False, error=f"the session has ended: {self.ended_message}",
                             code=NoSuchProcessError.exit_code, ended=True)
            self._queue.put((invocation, future))
        self.controller.wake()
        return future.result()

    # ----------------------------------------------- the tracer thread
    def poll(self) -> None:
        self._serve_pool()
        if self._queue.empty() and not self._held:
            return
        queued, self._held = self._held, []
        while True:
            try:
                queued.append(self._queue.get_nowait())
            except queue.Empty:
                break
        # a command that stops the target ahead (stops_ahead) runs alone: no other
        # command of its batch changes what it prepared; the rest is the next batch
        alone = [i for i, (invocation, _) in enumerate(queued)
                 if invocation.command.stops_ahead]
        cut = 1 if alone and alone[0] == 0 else (alone[0] if alone else len(queued))
        batch, self._held = queued[:cut], queued[cut:]
        if self._held:
            self.controller.wake()
        ready = []
        self._stops = []
        self.alone = len(batch) == 1
        for invocation, future in batch:
            try:
                invocation.command.prepare(self, invocation.args)
            except Exception as exc:      # the reply; its changes were not made
                future.set_result(failure(exc))
                continue
            ready.append((invocation, future))
        stop = any(invocation.command.stops_target for invocation, _ in ready)
        started = time.perf_counter()      # the pause: from the first interrupt to the resume
        # forks and clones met while stopping: handled before the commands change
        # the engines (Controller.settle)
        events = self.controller.settle(self.tracee.stop_all()) if stop else []
        replies = []
        try:
            for invocation, future in ready:
                reply = self._execute(invocation, future)
                if reply is not None:
                    replies.append((future, reply))
        finally:
            if stop:
                self._start_pool()
                self._follow_clones_if_needed()
                self._resume(events)
                self._stopped(started)
            if self._stops:
                self.last_pause, self.last_stops = max(self._stops), self._stops
            try:
                self.recording.after_commands()
            finally:
                # answered once what they changed is written (functions.json...)
                for future, reply in replies:
                    future.set_result(reply)

    def stop_for(self, work) -> None:
        """Tracer thread, in a command's ``prepare`` (the target running): every
        thread stopped for ``work`` alone, then resumed.  A first ``instrument``
        maps its areas so, in a stop shorter than one that also patches
        (calls/staging.py).  One of the batch's stops (``last_stops``)."""
        started = time.perf_counter()
        events = self.controller.settle(self.tracee.stop_all())
        try:
            work()
        finally:
            self._follow_clones_if_needed()
            self._resume(events)
            self._stopped(started)

    def _stopped(self, started: float) -> None:
        """A stop of the target that began at ``started`` (perf_counter) is over."""
        now = time.perf_counter()
        self._stops.append(now - started)
        self.stop_windows.append((started, now))

    def _execute(self, invocation: Invocation, future: Future) -> Reply | None:
        command = invocation.command
        try:
            data = command.execute(self, invocation)
            if data is WAIT_FOR_END:
                self._waiting_for_end.append(future)
                return None
            return Reply(True, text=command.render(data), data=data)
        except Exception as exc:  # every failure is one reply; the session goes on
            return failure(exc)

    def _follow_clones_if_needed(self) -> None:
        """Attached, until madtrace maps anything into the target (the first
        ``instrument``, data tracing), new threads are not traced: they never wait
        for the tracer (a thread-per-request server pays nothing per request); each
        stop of the target seizes them first (Tracee.stop_all).  With functions
        instrumented, the ring pool keeps it so (calls/thread_pool.py: new
        threads take their rings themselves); without it (data tracing, a
        followed fork child, a target the pool cannot serve), and when launched,
        every thread is traced from its creation (a fork made by an untraced
        thread would keep madtrace's mappings in the child).  The call page
        (process/call_page.py) is one of them: ``daemon -f`` makes it in the
        attach's stop, and a thread made before the instrument's stops that
        forked left it in its child (the child's maps held madtrace-calls).
        Every thread is stopped here."""
        tracee = self.tracee
        functions = self.recording.functions
        pool = functions is not None and functions.threads.active
        if pool and (self.recording.data is not None or self.controller.children):
            functions.threads.stop()
            pool = False
        mapped = (tracee.madtrace_areas is not None and bool(tracee.madtrace_areas.areas)) \
            or tracee.call_page is not None
        tracee.follow_clones(tracee.launched or (mapped and not pool)
                             or self.recording.data is not None or bool(self.controller.children))

    def _functions_installed(self) -> None:
        """Every thread stopped: the pool starts, and clones are followed or not."""
        self._start_pool()
        self._follow_clones_if_needed()

    def _start_pool(self) -> None:
        """Every thread stopped: the ring pool opens once functions are traced, in
        an attached session without data tracing or followed forks."""
        recording, functions = self.recording, self.recording.functions
        if functions is None or functions.rings is None or functions.threads.pool is not None \
                or self.tracee.launched or recording.data is not None \
                or recording.options.follow_forks:
            return
        why = functions.threads.start(self.controller.wake)
        if why:
            recording.log(f"new threads are traced from their creation: {why}")

    def _serve_pool(self) -> None:
        """Untraced threads about to fork or exec are seized (they do not stop);
        more rings are mapped when the pool runs low (the traced threads stopped)."""
        functions = self.recording.functions
        pool = functions.threads.pool if functions is not None else None
        if pool is None or functions.rings.closed:
            return
        with functions.rings.lock:
            requests, need = pool.requests(), pool.need_rings and pool.active
        for entry, tid in requests:
            self.tracee.seize_running(tid)
            pool.seized(entry, tid)
        if need:
            # the traced threads stop (a remote mmap); the untraced ones run on and
            # stay untraced: seizing them here made each a traced thread until its end
            started = time.perf_counter()
            events = self.controller.settle(self.tracee.stop_traced())
            try:
                with functions.rings.lock:
                    functions.rings.ensure_free(len(functions.rings.free_rings) + 8)
                    pool.fill()
            finally:
                self._resume(events)
                self.last_pause = time.perf_counter() - started
                self.stop_windows.append((started, started + self.last_pause))
                pool.growth_stops += 1

    def _resume(self, events) -> None:
        """Give the stop events to the run loop's policy (which resumes their
        threads), then resume the others, except those whose stop an engine left
        for the run loop (``Controller.deferred``: a data engine switched on or
        off meets faults and system call stops; resumed here, the run loop later
        resumed a running thread, ESRCH, and a deferred signal was lost)."""
        tracee = self.tracee
        for event in events:
            state = tracee.threads.get(event.tid)
            if state is not None and not state.running:
                self.controller.handle(event)
        if tracee.threads:
            tracee.resume_all(except_tids={event.tid for event in self.controller.deferred})

    def end(self, message: str) -> None:
        """The recording is over (tracer thread): answer and refuse what is queued."""
        with self._lock:
            self.ended_message = message
            pending, self._held = self._held, []
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
        self.controller.command_poll = None
        for callback in self.before_end_replies:
            callback()
        for future in self._waiting_for_end:
            future.set_result(Reply(True, text=message, data={"ended": message}, ended=True))
        self._waiting_for_end.clear()
        for _, future in pending:
            future.set_result(Reply(False, error=f"the session has ended: {message}",
                                    code=NoSuchProcessError.exit_code, ended=True))
        for callback in self.on_end:
            callback(message)

