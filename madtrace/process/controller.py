"""The run loop: what madtrace does with each event of its targets.

Policy, in one place:
- a signal not caused by madtrace is delivered to the target unchanged;
- new threads are traced (PTRACE_O_TRACECLONE) and resumed;
- fork/vfork children are followed (traced as another ``Tracee``) or left
  (``on_fork_child`` hooks undo madtrace's patches in the child, then it
  is detached);
- exec rebuilds what depends on the image (``on_exec`` hooks);
- group-stops keep the target job-control stopped (PTRACE_LISTEN);
- a stop request (Ctrl-C, SIGTERM, SIGHUP, --duration, a REPL command) stops
  every thread, runs the ``before_detach`` hooks (which restore all patches
  and protections), then the ``release`` hooks (which unmap what madtrace
  mapped) and detaches: the target continues as if never traced.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from typing import Callable

from ..errors import NoSuchProcessError
from . import ptrace_raw as pr
from .entry_start import AT_ENTRY_NOW, ON_THE_WAY, EntryStart
from .events import (Event, GroupStop, PtraceEventStop, SignalStop, SyscallStop, ThreadExited,
                     ThreadKilled, TrapStop, keep_signal)
from .tracee import Tracee, ThreadState, thread_group_of

SIGTRAP = signal.SIGTRAP
INT3 = b"\xcc"
# with a command hook, the run loop sleeps until a stop of the target (SIGCHLD) or a
# command (``wake``) arrives; this long at most (a safety net, never a latency)
POLL_MAX = 0.25
BOUND_PERIOD = 0.05     # s between two checks of --max-size (and a flight recorder's ticks)


class Controller:
    def __init__(self, tracee: Tracee, follow_forks: bool = False):
        self.tracee = tracee
        self.follow_forks = follow_forks
        self.children: dict[int, Tracee] = {}     # followed fork children, by pid
        self.child_exit: dict[int, object] = {}
        self.forks_seen = 0
        self.execs_seen = 0
        self.signals_forwarded = 0
        self.events_handled = 0       # ptrace stops and exits of traced threads, as handled
        self.stop_reason: str | None = None
        # what a detach could not restore or take out (an engine's hook failed), said
        # at the end of the recording and in meta.json (detach_failures)
        self.detach_failures: list[str] = []
        # a static executable that ended before it set its thread pointer: untraced
        self.never_set_fs = False
        self._hooks: dict[int, TraceeHooks] = {}
        # called with each fork child that is followed, after its parent's on_fork_child
        # hooks and before it first runs (a new recording starts in it)
        self.on_follow: list[Callable[[Tracee], None]] = []
        # called with a followed child once it has exited (its last thread gone)
        self.on_child_exit: list[Callable[[Tracee], None]] = []
        self._pending_foreign: dict[int, int] = {}  # pid -> wait status of not-yet-announced fork children
        # events met by an engine's stop_all (the threads stay stopped until handled),
        # first those met while attaching
        self.deferred: list = list(tracee.attach_events)
        tracee.attach_events = []
        # REPL/daemon commands: when set, the run loop polls for events instead of
        # blocking, and calls this between polls (it runs queued commands at a safe stop)
        # a front end calls ``wake`` after queueing a command
        self.command_poll: Callable[[], None] | None = None
        # SIGINT first goes here (an interactive REPL running a command): True when taken
        self.on_interrupt: Callable[[], bool] | None = None
        # called once, right after ``run`` first resumes the target: what an attach
        # does not need the target stopped for (files, the control socket's thread,
        # the answer to the client) waits till then, not the target
        self.after_resume: list[Callable[[], None]] = []
        self.running = False            # ``run`` has resumed the target
        self.attach_pause: float | None = None   # s from the seize to that resume (attached)
        self.attach_window: tuple[float, float] | None = None   # (seize, resume), perf_counter
        self._wake_r = self._wake_w = -1     # the run loop's wake-up pipe, while it runs
        # work asked for from a signal handler or another thread (a flight recorder's
        # trigger), run by the run loop at its next safe point (the target running)
        self.actions: list[Callable[[], None]] = []

    def wake(self) -> None:
        """Any thread: the run loop looks at its commands now."""
        try:
            os.write(self._wake_w, b"c")
        except OSError:
            pass          # full of wake-ups already, or the loop is over

    def hooks(self, tracee: Tracee | None = None) -> "TraceeHooks":
        """What the engines of ``tracee`` (default: the main target) do at its events."""
        tracee = tracee or self.tracee
        hooks = self._hooks.get(id(tracee))
        if hooks is None or hooks.tracee is not tracee:
            hooks = self._hooks[id(tracee)] = TraceeHooks(tracee)
        return hooks

    def forget(self, tracee: Tracee) -> None:
        """``tracee`` is gone (exited): its hooks go too (per-event costs stay flat)."""
        hooks = self._hooks.get(id(tracee))
        if hooks is not None and hooks.tracee is tracee:
            del self._hooks[id(tracee)]

    def settle_attach(self) -> None:
        """Before engines are installed in a process just attached: a fork, vfork or
        clone met while stopping it leaves a new process or thread stopped at its
        first stop (a vfork parent waits for its child meanwhile): handle those now,
        then stop every thread again."""
        self.deferred = self.settle(self.deferred)

    def settle(self, events: list, rounds: int = 16, tracee: Tracee | None = None) -> list:
        """``events``: met while every thread of ``tracee`` (the main target by
        default) was being stopped (``stop_all``), for a change of the engines
        (attach, a live command, detach).  The forks, vforks and clones among them
        are handled now, under the engines in place when they happened (a fork
        child met while data tracing is turned off must still have its copy of the
        protected pages opened), then every thread is stopped again (a vfork
        parent once its child has exec'd or exited: its vfork-done stop).
        Returns the other events."""
        tracee = tracee or self.tracee
        kinds = (pr.PTRACE_EVENT_FORK, pr.PTRACE_EVENT_VFORK, pr.PTRACE_EVENT_CLONE)
        for _ in range(rounds):
            now = [e for e in events if isinstance(e, PtraceEventStop) and e.event in kinds]
            if not now:
                return events
            events = [e for e in events if e not in now]
            for event in now:
                if event.tid in tracee.threads:
                    self.handle(event, tracee)
            self._route_foreign()
            events += tracee.stop_all()
        return events

    # ------------------------------------------------------------ stop requests
    def request_stop(self, reason: str) -> None:
        """Async-safe enough for a Python signal handler: sets the reason and kicks
        one running thread so that the blocking wait returns."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._interrupt_one()

    def request_action(self, action: Callable[[], None]) -> None:
        """``action`` runs in the run loop at its next safe point, on the tracer's
        thread, the target running.  As async-safe as request_stop:
        the loop's wake-up pipe while it polls, else one running thread interrupted."""
        self.actions.append(action)
        if self.command_poll is not None:
            self.wake()
        else:
            self._interrupt_one()

    def _interrupt_one(self) -> None:
        """One running thread interrupted: the run loop's blocking wait returns."""
        for state in list(self.tracee.threads.values()):
            if state.running and not state.gone:
                try:
                    pr.interrupt(state.tid)
                    return
                except Exception:
                    continue

    def install_signal_handlers(self, launched: bool) -> dict:
        """SIGTERM/SIGHUP (and SIGINT when attached) make madtrace restore and detach.
        When madtrace launched the target, Ctrl-C at the terminal reaches the target
        too, as without madtrace; the tracer then follows the target's fate."""
        previous = {}

        def handler(signum, frame):
            if signum == signal.SIGINT and self.on_interrupt is not None and self.on_interrupt():
                return          # an interactive command took it (it is cancelled)
            self.request_stop(signal.Signals(signum).name)

        sigs = [signal.SIGTERM, signal.SIGHUP] + ([] if launched else [signal.SIGINT])
        for sig in sigs:
            previous[sig] = signal.signal(sig, handler)
        if launched:
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        return previous

    def arm_bounds(self, seconds: float | None, max_bytes: int | None = None,
                   size: Callable[[], int] | None = None,
                   periodic: Callable[[], None] | None = None) -> None:
        """A stop request once ``seconds`` have passed ("duration") or once
        ``size()`` reaches ``max_bytes`` ("max-size", checked every BOUND_PERIOD s);
        ``periodic()`` every BOUND_PERIOD s; on the tracer's thread (SIGALRM),
        which alone may stop the target."""
        if not seconds and not (max_bytes and size) and periodic is None:
            return
        start = time.monotonic()

        def tick(signum, frame):
            if periodic is not None:
                periodic()
            if seconds and time.monotonic() - start >= seconds:
                self.request_stop("duration")
            elif max_bytes and size is not None and size() >= max_bytes:
                self.request_stop("max-size")

        signal.signal(signal.SIGALRM, tick)
        if (max_bytes and size is not None) or periodic is not None:
            first = min(BOUND_PERIOD, seconds) if seconds else BOUND_PERIOD
            signal.setitimer(signal.ITIMER_REAL, first, BOUND_PERIOD)
        else:
            signal.setitimer(signal.ITIMER_REAL, seconds)

    # -------------------------------------------------------------- main loop
    def run(self) -> str:
        """Runs until the target exits ('exited') or a stop request ('detached')."""
        tracee = self.tracee
        tracee.resume_all(except_tids={event.tid for event in self.deferred})
        self.running = True
        if tracee.attach_started is not None:
            now = time.perf_counter()
            self.attach_pause = now - tracee.attach_started
            self.attach_window = (tracee.attach_started, now)
            tracee.attach_started = None
        while self.after_resume:
            self.after_resume.pop(0)()
        with self._woken_by_stops():
            while True:
                if self.stop_reason is not None:
                    self.detach_all()
                    return "detached"
                if tracee.exit_event is not None and not tracee.threads:
                    self._reap_children()
                    return "exited"
                if self.actions:
                    actions, self.actions = self.actions, []
                    for action in actions:
                        action()
                    continue
                if self.deferred:
                    # events of threads an engine stopped while it worked (still stopped there)
                    event = self.deferred.pop(0)
                    owner = self._tracee_of(event.tid)
                    if owner is not None:
                        self.handle(event, owner)
                    continue
                polling = self.command_poll is not None
                if polling:
                    self.command_poll()
                    if self.stop_reason is not None:
                        continue
                event = tracee.wait_event(block=not polling)
                self._route_foreign()
                if event is None:
                    if tracee.exit_event is None and not tracee.threads:
                        return "exited"
                    if polling and not tracee.foreign:
                        self._sleep()
                    continue
                self.handle(event)

    @contextlib.contextmanager
    def _woken_by_stops(self):
        """While commands are polled for, a stop of a traced thread (the kernel sends
        its tracer SIGCHLD) writes to the wake-up pipe: the run loop sleeps on the
        pipe, not on a timer, so a stop waits for no timer (a request thread of a
        server: one stop when it is created, one when it exits).  Main thread only
        (signal handlers); elsewhere the loop sleeps POLL_MAX at most."""
        if self.command_poll is None:      # no commands: the loop blocks in waitpid
            yield
            return
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        main = threading.current_thread() is threading.main_thread()
        if main:
            previous_handler = signal.signal(signal.SIGCHLD, lambda signum, frame: None)
            signal.siginterrupt(signal.SIGCHLD, False)     # SA_RESTART: waitpid in C goes on
            previous_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        try:
            yield
        finally:
            if main:
                signal.set_wakeup_fd(previous_fd)
                signal.signal(signal.SIGCHLD, previous_handler)
            wake_r, wake_w = self._wake_r, self._wake_w
            self._wake_r = self._wake_w = -1
            os.close(wake_r)
            os.close(wake_w)

    def _sleep(self) -> None:
        """Until a stop or a command (or POLL_MAX)."""
        ready, _, _ = select.select([self._wake_r], [], [], POLL_MAX)
        if ready:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass

    def _tracee_of(self, tid: int) -> Tracee | None:
        for tracee in [self.tracee, *self.children.values()]:
            if tid in tracee.threads:
                return tracee
        return None

    def handle(self, event, tracee: Tracee | None = None) -> None:
        tracee = tracee or self.tracee
        self.events_handled += 1
        hooks = self.hooks(tracee)
        tid = event.tid
        if isinstance(event, (ThreadExited, ThreadKilled)):
            return
        if isinstance(event, SignalStop):
            for claim in hooks.signal_claimers:
                if claim(tracee, event):
                    return
            for hook in hooks.before_forward_signal:
                hook(tracee, event)
            self.signals_forwarded += 1
            tracee.resume(tid, event.signum)
            return
        if isinstance(event, PtraceEventStop):
            if event.event in (pr.PTRACE_EVENT_FORK, pr.PTRACE_EVENT_VFORK):
                self._on_fork(tracee, event.message, vfork=event.event == pr.PTRACE_EVENT_VFORK,
                              parent_tid=tid)
            elif event.event == pr.PTRACE_EVENT_VFORK_DONE:
                for hook in hooks.on_vfork_done:
                    hook(tracee, tid)
            elif event.event == pr.PTRACE_EVENT_EXEC:
                self.execs_seen += 1
                for hook in list(hooks.on_exec):
                    hook(tracee)
            elif event.event == pr.PTRACE_EVENT_EXIT:
                for hook in hooks.on_thread_exit:
                    hook(tracee, tid)
            tracee.resume(tid, 0)
            return
        if isinstance(event, SyscallStop):
            for claim in hooks.syscall_claimers:
                if claim(tracee, event):
                    return
            tracee.resume(tid, 0)
            return
        if isinstance(event, (GroupStop, TrapStop)):
            tracee.resume(tid, 0)
            return
        raise AssertionError(f"unhandled event {event!r}")

    # ------------------------------------------------------------ fork/vfork
    def _on_fork(self, parent: Tracee, child_pid: int, vfork: bool, parent_tid: int) -> None:
        self.forks_seen += 1
        child = Tracee(child_pid, launched=False, options=parent.options)
        child.before_delivery = list(parent.before_delivery)    # the same areas, forked
        child.threads[child_pid] = ThreadState(child_pid, running=True)
        if parent.call_page is not None:     # a vfork child shares its parent's
            child.call_page = parent.call_page if vfork else parent.call_page.inherit(child_pid)
        # the child's first stop (a TrapStop) may already have been read
        status = self._pending_foreign.pop(child_pid, None)
        if status is not None:
            child.record(child_pid, status)
        else:
            child.wait_event(block=True, tid=child_pid)
        hooks = self.hooks(parent)
        if vfork:
            # it shares its parent's memory until it execs: nothing to undo, but that
            # memory must be fit for an untraced thread meanwhile
            for vfork_hook in hooks.on_vfork_start:
                vfork_hook(parent, parent_tid, child)
        else:
            for hook in hooks.on_fork_child:
                hook(child, child_pid)
            for release in hooks.release_in_child:
                release(parent, child)
        if self.follow_forks:
            self.children[child_pid] = child
            for follow in self.on_follow:
                follow(child)
            child.resume(child_pid, 0)
            return
        if child.call_page is not None:
            try:
                child.call_page.release(child)
            except Exception as exc:     # it stays in the child, said
                self.detach_failures.append(f"fork child {child_pid}: the call page: "
                                            f"{type(exc).__name__}: {exc}")
        try:
            pr.detach(child_pid, 0)
        except NoSuchProcessError:
            pass
        child.mem.close()

    def _route_foreign(self) -> None:
        for tracee in [self.tracee] + list(self.children.values()):
            while tracee.foreign:
                tid, status = tracee.foreign.pop(0)
                owner = self._owner_of(tid)
                if owner is None:
                    self._pending_foreign[tid] = status
                    continue
                if tid not in owner.threads and not os.WIFSTOPPED(status):
                    continue
                if tid not in owner.threads:
                    owner.threads[tid] = ThreadState(tid, running=True)
                if owner.after_stop is not None:
                    owner.after_stop()      # its data engine's write-backs, as its own wait does
                event = owner.record(tid, status)
                if owner.exit_event is not None and not owner.threads:
                    self._child_gone(owner)
                    continue
                self.handle(event, owner)

    def _child_gone(self, child: Tracee) -> None:
        self.child_exit[child.pid] = child.exit_event
        self.children.pop(child.pid, None)
        for hook in self.on_child_exit:
            hook(child)
        self.forget(child)

    def _owner_of(self, tid: int) -> Tracee | None:
        if tid in self.children:
            return self.children[tid]
        for child in self.children.values():
            if tid in child.threads:
                return child
        tgid = thread_group_of(tid)
        return self.children.get(tgid) if tgid is not None else None

    def _reap_children(self) -> None:
        """Followed children still running when the main target exits keep being
        traced until they exit too."""
        while self.children:
            any_child = next(iter(self.children.values()))
            event = any_child.wait_event(block=True)
            self._route_foreign()
            if event is None:
                self.children.pop(any_child.pid, None)
                continue
            if any_child.exit_event is not None and not any_child.threads:
                self._child_gone(any_child)
                continue
            self.handle(event, any_child)

    # ---------------------------------------------------------------- leaving
    def detach_all(self) -> None:
        """Stop every thread, let the engines restore what they changed, then
        handle the stops met on the way as the run loop would (an engine finishes
        those it caused: a fault on a page that is open again, a stub's trap; the
        target's own signals are forwarded), and detach.  Before, a stop caused by
        madtrace was taken for the target's signal and delivered at detach
        (SIGSEGV or SIGTRAP killed a target detached while data tracing)."""
        deferred, self.deferred = self.deferred, []
        done: set[int] = set()
        while True:
            # followed fork children too, those made while settling included
            tracee = next((t for t in [self.tracee, *self.children.values()] if t.pid not in done),
                          None)
            if tracee is None:
                break
            done.add(tracee.pid)
            try:
                events = self._stop_settled(tracee, [e for e in deferred if e.tid in tracee.threads])
                # threads stopped before (a stop request's interrupt): a fault or int3 met
                # just before that trap, still queued, is handled here, not left to kill
                # the detached target
                events += tracee.take_queued_signals()
            except NoSuchProcessError:
                events = []
            restored = True
            for hook in self.hooks(tracee).before_detach:
                try:
                    hook(tracee)
                except Exception as exc:
                    # keep restoring and detaching: a half-restored target is still
                    # better than one left stopped under a dead tracer; said at the end
                    restored = False
                    self.detach_failures.append(f"process {tracee.pid}: restoring: "
                                                f"{type(exc).__name__}: {exc}")
            for event in events:
                state = tracee.threads.get(event.tid)
                if state is None or state.running:
                    continue
                try:
                    self.handle(event, tracee)
                except Exception:
                    keep_signal(state, event)   # it stays stopped: detach resumes it
            releases = self.hooks(tracee).release
            if releases and not restored:
                # what was not restored may still lead into madtrace's areas (a patch
                # to a trampoline, a protected page whose fault handler is there):
                # they stay, as when the tracer dies; the next attach takes them out
                releases = []
                self.detach_failures.append(f"process {tracee.pid}: madtrace's areas stay "
                                            "mapped (restoring failed)")
            if releases and tracee.threads:
                try:     # the resumed threads again, keeping their own signals for the detach
                    for event in self._stop_settled(tracee):
                        state = tracee.threads.get(event.tid)
                        if state is not None:
                            keep_signal(state, event)
                except NoSuchProcessError:
                    pass
                for hook in releases:
                    try:
                        hook(tracee)
                    except Exception as exc:     # what could not be taken out stays
                        self.detach_failures.append(f"process {tracee.pid}: taking madtrace "
                                                    f"out: {type(exc).__name__}: {exc}")
            tracee.detach()   # stops the resumed threads again (keeping their own signals)
            self.detach_failures += [f"process {tracee.pid}: {p}" for p in tracee.detach_problems]

    def _stop_settled(self, tracee: Tracee, deferred=()) -> list:
        """Every thread of ``tracee`` stopped, to restore or take out what madtrace
        put in (detach).  A fork, vfork or clone met while stopping is handled
        first, under the engines in place (``settle``): a thread at its vfork event
        stop can run no system call for them (its child waits to run; the
        restore failed and was skipped), so the vfork runs on to its vfork-done
        stop first.  Returns the other events (``deferred`` first)."""
        return self.settle([*deferred, *tracee.stop_all()], tracee=tracee)

    # --------------------------------------------------------- breakpoints
    def run_to_entry(self) -> None:
        """Continue the freshly exec'd target (stopped at its exec) to the
        executable's entry point without a trap (entry_start.py), and leave it
        stopped there."""
        tracee = self.tracee
        start = EntryStart(tracee)
        if not start.arm(tracee.pid):
            start.arm_static(tracee.pid)     # a static executable: on to its thread pointer

        def arrived(event) -> bool | None:
            if not isinstance(event, SyscallStop):
                return False
            state = start.step(tracee, event)
            return True if state == AT_ENTRY_NOW else None if state == ON_THE_WAY else False
        try:
            self._run_until(arrived)
        finally:
            if start.armed and start.static and not tracee.threads:
                self.never_set_fs = True
            if start.armed and tracee.threads:
                start.disarm()

    def run_to(self, address: int) -> None:
        """Continue the (single-threaded, freshly exec'd) target until ``address``,
        with a temporary int3, and leave it stopped there with rip = address."""
        tracee = self.tracee
        original = tracee.mem.read(address, 1)
        tracee.mem.write(address, INT3)

        def arrived(event) -> bool:
            if not isinstance(event, SignalStop) or event.signum != SIGTRAP:
                return False
            regs = tracee.get_regs(event.tid)
            if regs.rip != address + 1:
                return False
            regs.rip = address
            tracee.set_regs(regs, event.tid)
            return True
        try:
            self._run_until(arrived)
        finally:
            if tracee.threads:
                tracee.mem.write(address, original)

    def _run_until(self, arrived: Callable[[Event], bool | None]) -> None:
        """Resume the target and handle its events until ``arrived(event)`` says
        it is where it should be (True: every thread is stopped then; None: the
        event was dealt with; False: not that event), or the target is gone."""
        tracee = self.tracee
        tracee.resume_all()
        while True:
            event = tracee.wait_event(block=True)
            self._route_foreign()
            if tracee.exit_event is not None and not tracee.threads:
                return
            if event is None:
                continue
            done = arrived(event)
            if done:
                tracee.stop_all_quietly()
                return
            if done is False:
                self.handle(event)


class TraceeHooks:
    """The engines' hooks for one traced process (the main target or a followed
    fork child): each runs only for events of that process."""

    def __init__(self, tracee: Tracee):
        self.tracee = tracee
        self.on_exec: list[Callable[[Tracee], None]] = []
        # restore every patch and protection (all threads stopped), before detaching
        self.before_detach: list[Callable[[Tracee], None]] = []
        # called for each fork child (not vfork) before it runs, followed or not:
        # the child is a copy of the parent, patches included
        self.on_fork_child: list[Callable[[Tracee, int], None]] = []
        # vfork: called with (parent, parent tid, child) before the child runs in the
        # parent's memory, and with (parent, parent tid) at the parent's vfork-done stop
        self.on_vfork_start: list[Callable[[Tracee, int, Tracee], None]] = []
        self.on_vfork_done: list[Callable[[Tracee, int], None]] = []
        # called last before detaching, every thread stopped and every stop handled:
        # madtrace's mappings come out of the target (target/mappings.py)
        self.release: list[Callable[[Tracee], None]] = []
        # called for each fork child after the on_fork_child hooks, with (parent, child):
        # madtrace's mappings come out of the child's copy (target/mappings.py)
        self.release_in_child: list[Callable[[Tracee, Tracee], None]] = []
        # called at PTRACE_EVENT_EXIT, while the exiting thread is still stopped
        self.on_thread_exit: list[Callable[[Tracee, int], None]] = []
        # engines claim signals they caused (breakpoints, protection faults); True if handled
        self.signal_claimers: list[Callable[[Tracee, SignalStop], bool]] = []
        # a signal no engine claimed, about to be delivered to the program (its thread
        # stopped): a flight recorder's crash trigger writes what led up to it
        self.before_forward_signal: list[Callable[[Tracee, SignalStop], None]] = []
        # syscall entry/exit stops (when tracee.trace_syscalls): True if handled (resumed)
        self.syscall_claimers: list[Callable[[Tracee, SyscallStop], bool]] = []
