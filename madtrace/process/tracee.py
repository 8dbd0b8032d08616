"""A traced process: its threads, their stops, and the ptrace requests on them.

Every thread is attached with PTRACE_SEIZE (also for launched programs: the
child blocks on a pipe until it is seized, then execs), so group-stops,
PTRACE_INTERRUPT and new threads behave the same way in launch and attach
mode.  ``wait_event`` returns typed events (see ``events``); the policy of
what to do with each (forward a signal, follow a fork...) lives in
``controller``.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import struct
import threading
import time
from dataclasses import dataclass, field

from ..errors import (CommandNotFoundError, NoSuchProcessError, NotElfError, PermissionDeniedError,
                      TracerInternalError)
from . import ptrace_raw as pr
from . import queued_faults, spawn_proxy
from .events import (Event, GroupStop, PtraceEventStop, ThreadExited,
                     ThreadKilled, TrapStop, decode_status, keep_signal)
from .memory import ProcessMemory
from .traceable import check_traceable

BASE_OPTIONS = (pr.PTRACE_O_TRACESYSGOOD | pr.PTRACE_O_TRACECLONE | pr.PTRACE_O_TRACEEXEC
                | pr.PTRACE_O_TRACEFORK | pr.PTRACE_O_TRACEVFORK | pr.PTRACE_O_TRACEVFORKDONE
                | pr.PTRACE_O_TRACEEXIT)
AT_ENTRY = 9


@dataclass
class ThreadState:
    tid: int
    running: bool = False
    # signal to deliver when the thread is next resumed (the target's own signal)
    pending_signal: int = 0
    # in a job-control group-stop, resumed with PTRACE_LISTEN
    group_stopped: bool = False
    # a zombie leader (exited while other threads run): nothing to stop or resume
    gone: bool = False
    # created after madtrace attached and not resumed yet (see Tracee.on_new_thread)
    fresh: bool = False
    # the thread whose clone() made it (None: there at attach/launch, or unknown)
    creator: int | None = None
    last_event: Event | None = field(default=None, repr=False)


def tracer_of(tid: int) -> int | None:
    """TracerPid of a thread (0: not traced; None: gone)."""
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def is_exiting(tid: int) -> bool:
    """Whether a thread is gone or dying (zombie or dead: PTRACE_SEIZE answers EPERM
    for a thread whose exit has begun, as for one traced by another tracer)."""
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split()[1] in ("Z", "X")
    except OSError:
        return True
    return False


def thread_group_of(tid: int) -> int | None:
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def list_tids(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return []


def resolve_command(command: str) -> str:
    if "/" in command:
        path = command
    else:
        found = shutil.which(command)
        if found is None:
            raise CommandNotFoundError(f"command not found: {command}")
        path = found
    if not os.path.exists(path):
        raise CommandNotFoundError(f"no such file: {command}")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise CommandNotFoundError(f"not an executable file: {command}")
    return path


class _SeenDict(dict):
    """A dict that remembers every key it ever held (threads seen over a run)."""

    def __init__(self):
        super().__init__()
        self.seen: set[int] = set()

    def __setitem__(self, key, value):
        self.seen.add(key)
        super().__setitem__(key, value)


class Tracee:
    """One traced process (thread group) and all its traced threads."""

    def __init__(self, pid: int, launched: bool, options: int):
        self.pid = pid
        self.launched = launched
        self.options = options
        self.threads: dict[int, ThreadState] = _SeenDict()
        self.mem = ProcessMemory(pid)
        self.exit_event: ThreadExited | ThreadKilled | None = None
        self._entry: int | None = None      # AT_ENTRY of the current image
        self._stashed: list[tuple[int, int]] = []  # (tid, status) read while waiting for someone else
        # statuses of processes that are not ours (fork children), for the controller
        self.foreign: list[tuple[int, int]] = []
        # called with the tid of each new thread before it first runs
        self.on_new_thread: list = []
        # (tracee, tid, signal) before a resume that delivers a signal (harmless if none is)
        self.before_delivery: list = []
        # events met while attaching (Tracee.attach), for the controller to handle
        self.attach_events: list[Event] = []
        self.attach_started: float | None = None   # perf_counter() at the seize (attach)
        # resume with PTRACE_SYSCALL (syscall entry/exit stops) instead of PTRACE_CONT
        self.trace_syscalls = False
        # while data tracing: fast_wait(block) replaces waitpid(-1) (the C loop of
        # fastloop.py: it handles the faults it can and returns (tid, status) of the
        # first stop it cannot, or None); after_stop() runs after every other wait
        # (it writes back the data stubs' stores)
        self.fast_wait = None
        self.after_stop = None
        # what madtrace mapped into this process (target.mappings.MadtraceAreas), taken
        # out again when the session ends
        self.madtrace_areas = None
        # where a thread lent to remote system calls finds its registers (call_page.py)
        self.call_page = None
        self.detach_problems: list[str] = []     # what detach could not take out, said
        # False: new threads are not traced (no PTRACE_O_TRACECLONE: they never wait
        # for the tracer); stop_all then seizes the threads it finds in /proc first
        # (``follow_clones``)
        self.clones_followed = bool(options & pr.PTRACE_O_TRACECLONE)

    # ---------------------------------------------------------------- creation
    @classmethod
    def spawn(cls, argv: list[str], env: dict[str, str] | None = None,
              options: int = BASE_OPTIONS) -> "Tracee":
        """fork + exec ``argv``; returns with the new image stopped at its exec stop."""
        path = resolve_command(argv[0])
        proxy = spawn_proxy.take()      # forked by madtrace-ctl (spawn_proxy.py)
        if proxy is not None:
            pid, go_w, err_r = proxy.pid, proxy.go_fd, proxy.err_fd
        else:
            go_r, go_w = os.pipe()
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            pid = os.fork()
        if pid == 0:  # child: wait to be seized, then exec; report exec failure through err_w
            try:
                os.close(go_w)
                os.close(err_r)
                os.read(go_r, 1)
                os.close(go_r)
                # Python ignores these at start-up; the program gets them as from a shell
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(sig, signal.SIG_DFL)
                if env is None:
                    os.execv(path, argv)
                os.execve(path, argv, env)
            except OSError as exc:
                os.write(err_w, struct.pack("<i", exc.errno or errno.ENOEXEC))
            finally:
                os._exit(127)
        if proxy is None:
            os.close(go_r)
            os.close(err_w)
        try:
            pr.seize(pid, options | pr.PTRACE_O_EXITKILL)
        except Exception:
            if proxy is not None:       # its parent reaps it
                proxy.release()
                raise
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        tracee = cls(pid, launched=True, options=options)
        tracee.threads[pid] = ThreadState(pid, running=True)
        # the proxied child execs the path written (it may differ in $PATH lookups)
        os.write(go_w, os.fsencode(path) if proxy is not None else b"x")
        os.close(go_w)
        failure = os.read(err_r, 4)
        os.close(err_r)
        while True:
            event = tracee.wait_event()
            if isinstance(event, PtraceEventStop) and event.event == pr.PTRACE_EVENT_EXEC:
                break
            if isinstance(event, (ThreadExited, ThreadKilled)):
                code = struct.unpack("<i", failure)[0] if len(failure) == 4 else 0
                if code == errno.ENOEXEC:
                    raise NotElfError(f"cannot execute {argv[0]}: not an ELF executable or script")
                raise CommandNotFoundError(
                    f"cannot execute {argv[0]}: {os.strerror(code) if code else 'exec failed'}")
            tracee.resume(event.tid)
        # EXITKILL was only for the window before exec (a tracer crash must not leave the
        # child blocked); from here on the target outlives the tracer.
        pr.set_options(pid, options)
        return tracee

    @classmethod
    def attach(cls, pid: int, options: int = BASE_OPTIONS) -> "Tracee":
        """Seize every thread of ``pid`` and stop them all."""
        check_traceable(pid)
        tracee = cls(pid, launched=False, options=options)
        tracee.attach_started = time.perf_counter()
        try:
            tracee._seize_all_threads()
            # a signal, a clone, a fork or vfork met while stopping: the controller
            # handles them first (dropped, a signal was lost and a vfork child stayed
            # stopped for good, its parent waiting for it)
            tracee.attach_events = tracee.stop_all()
        except BaseException:
            tracee.detach()
            raise
        return tracee

    def _seize_all_threads(self) -> None:
        # Threads created meanwhile by an already seized thread are auto-attached
        # (TRACECLONE); those created by a not yet seized one show up in /proc on the
        # next pass. Loop until a pass finds nothing new.
        while True:
            new = [t for t in list_tids(self.pid) if t not in self.threads]
            if not new:
                if not self.threads:
                    raise NoSuchProcessError(f"no such process: {self.pid}")
                return
            for tid in new:
                try:
                    pr.seize(tid, self.options)
                except NoSuchProcessError:
                    if tid == self.pid:
                        raise
                    continue  # thread exited meanwhile
                except PermissionDeniedError as exc:
                    if tracer_of(tid) in (os.getpid(), threading.get_native_id()):
                        # made by a thread seized a moment ago: already ours (TRACECLONE),
                        # its first stop still to come
                        self.threads[tid] = ThreadState(tid, running=True, fresh=True)
                        continue
                    if tid != self.pid and is_exiting(tid):
                        continue  # exiting (a thread joined meanwhile): nothing to trace
                    raise PermissionDeniedError(f"cannot attach to process {self.pid}: {exc}") from None
                self.threads[tid] = ThreadState(tid, running=True)

    # ------------------------------------------------------------------ waiting
    def wait_event(self, block: bool = True, tid: int = -1) -> Event | None:
        """Wait for the next stop or exit of a traced thread and update thread states.

        Returns None when nothing is left to wait for, when ``block`` is False and
        nothing happened, or when the status belonged to another process (a fork
        child), which is queued in ``foreign`` for the controller."""
        for i, (stid, status) in enumerate(self._stashed):
            if tid in (-1, stid):
                del self._stashed[i]
                return self.record(stid, status)
        flags = pr.WALL | (0 if block else os.WNOHANG)
        while True:
            try:
                if tid == -1 and self.fast_wait is not None:
                    got = self.fast_wait(block)
                    if got is None:
                        return None
                    wtid, status = got
                else:
                    wtid, status = os.waitpid(tid, flags)
                    if wtid and self.after_stop is not None:
                        self.after_stop()
            except ChildProcessError:
                return None
            if wtid == 0:
                return None
            if wtid not in self.threads:
                if os.WIFSTOPPED(status) and thread_group_of(wtid) == self.pid:
                    # a new thread whose first stop came before its parent's CLONE event
                    self.threads[wtid] = ThreadState(wtid, running=True, fresh=True)
                else:
                    self.foreign.append((wtid, status))
                    return None  # the controller routes it to its owner
            return self.record(wtid, status)

    def record(self, tid: int, status: int) -> Event:
        """Turn a raw wait status of one of our threads into an Event, updating state."""
        event = decode_status(tid, status)
        state = self.threads.get(tid)
        if isinstance(event, (ThreadExited, ThreadKilled)):
            self.threads.pop(tid, None)
            if tid == self.pid:
                self.exit_event = event
            return event
        state.running = False
        state.gone = False
        state.last_event = event
        if isinstance(event, PtraceEventStop) and event.event == pr.PTRACE_EVENT_CLONE:
            child = event.message
            if child not in self.threads:
                self.threads[child] = ThreadState(child, running=True, fresh=True)
            self.threads[child].creator = tid
        elif isinstance(event, PtraceEventStop) and event.event == pr.PTRACE_EVENT_EXEC:
            former = event.message
            if former != tid:  # a non-leader thread exec'd: it now has the leader's tid
                self.threads.pop(former, None)
            for other in [t for t in self.threads if t != tid]:
                # every other thread is gone after exec; the kernel reports nothing more for them
                if not os.path.exists(f"/proc/{self.pid}/task/{other}"):
                    self.threads.pop(other, None)
            self.mem.close()
            self.mem = ProcessMemory(self.pid)
            self._entry = self.call_page = None
            if self.madtrace_areas is not None:
                self.madtrace_areas.image_replaced()
        return event

    # ----------------------------------------------------------- stop / resume
    def resume(self, tid: int, signum: int | None = None) -> None:
        """Resume one stopped thread, delivering ``signum`` (default: its pending signal)."""
        state = self.threads[tid]
        if state.gone:
            return
        if state.fresh:
            # first resume of a new thread: its registers (fs base...) are final now
            state.fresh = False
            for hook in self.on_new_thread:
                hook(tid)
        if signum is None:
            signum, state.pending_signal = state.pending_signal, 0
        if signum:
            for hook in self.before_delivery:
                hook(self, tid, signum)
        if isinstance(state.last_event, GroupStop):
            pr.listen(tid)  # stay job-control stopped, but report SIGCONT / interrupts
            state.group_stopped = True
        else:
            if self.trace_syscalls:
                pr.syscall(tid, signum)
            else:
                pr.cont(tid, signum)
            state.group_stopped = False
        state.running = True

    def interrupt(self, tid: int) -> None:
        pr.interrupt(tid)

    def stop_all(self) -> list[Event]:
        """Bring every thread into a ptrace stop. Events other than our own interrupt
        stops (a signal, an exit, a clone...) are returned for the caller to handle;
        the threads they concern are stopped too (or gone).  While clones are not
        followed, the threads not traced yet are seized first, until a listing made
        with every known thread stopped finds none (no thread is left to make one)."""
        events = self._stop_known()
        while not self.clones_followed and self._seize_untraced():
            events += self._stop_known()
        return events

    def stop_traced(self) -> list[Event]:
        """``stop_all`` without seizing the threads not traced yet: they run on (a
        ring pool's request threads, which must never wait for the tracer, nor
        become traced by a stop of the tracer's own).  For work that needs one
        stopped thread (a remote system call) and no change of the clone option."""
        return self._stop_known()

    def hold_all(self) -> tuple[list[Event], list[int]]:
        """``stop_all`` for a caller that resumes afterwards the threads it stopped:
        (the events met, to be handled by the caller; the threads to resume).  The
        latter are all the threads that ran before and are stopped now, *with*
        those this call met at their first stop (a clone made meanwhile, a thread
        seized meanwhile), but without those an event names.  A caller that
        resumed only the threads it had seen running before left such a new
        thread stopped for good (a pthread_join waited forever)."""
        stopped_before = {t for t, s in self.threads.items() if not s.running}
        events = self.stop_all()
        met = {e.tid for e in events}
        return events, [t for t, s in self.threads.items()
                        if t not in stopped_before and t not in met and not s.running]

    def _seize_untraced(self) -> bool:
        """Seizes the threads of /proc/PID/task not traced yet (they stop at the next
        _stop_known; their rings etc. are set up at their first resume, as for a
        new thread).  Returns whether there were any."""
        seized = False
        for tid in [t for t in list_tids(self.pid) if t not in self.threads]:
            try:
                pr.seize(tid, self.options)
            except (NoSuchProcessError, PermissionDeniedError):
                continue            # exited meanwhile
            self.threads[tid] = ThreadState(tid, running=True, fresh=True)
            seized = True
        return seized

    def seize_running(self, tid: int) -> bool:
        """Traces thread ``tid`` of this process from now on, without stopping it
        (its forks, execs, signals and exit stop from now on).  False: it is gone."""
        if tid in self.threads:
            return True
        if thread_group_of(tid) != self.pid:
            return False
        try:
            pr.seize(tid, self.options)
        except (NoSuchProcessError, PermissionDeniedError):
            return False
        self.threads[tid] = ThreadState(tid, running=True)
        return True

    def follow_clones(self, on: bool) -> None:
        """New threads traced from their creation (PTRACE_O_TRACECLONE) or not, from
        now on; every thread must be stopped (``stop_all``)."""
        if on == self.clones_followed:
            return
        self.options = (self.options | pr.PTRACE_O_TRACECLONE) if on else \
            (self.options & ~pr.PTRACE_O_TRACECLONE)
        for state in list(self.threads.values()):
            if state.gone or state.running:
                continue
            try:
                pr.set_options(state.tid, self.options)
            except NoSuchProcessError:
                pass                # exiting: its exit is on its way
        self.clones_followed = on

    def _stop_known(self) -> list[Event]:
        other_events: list[Event] = []
        while True:
            running = [s for s in self.threads.values() if s.running and not s.gone]
            if not running:
                return other_events
            for state in running:
                try:
                    self.interrupt(state.tid)
                except NoSuchProcessError:
                    if state.tid == self.pid and not self._leader_alive():
                        state.gone = True  # zombie leader: reported only when the group exits
                    # otherwise exiting: its exit status is on its way
            for state in running:
                if state.gone or state.tid not in self.threads:
                    continue
                if state.tid == self.pid:
                    event = self.wait_leader()
                    if state.gone:
                        continue
                else:
                    event = self.wait_event(block=True, tid=state.tid)
                if isinstance(event, TrapStop):
                    event = self.take_queued_signal(state.tid, event)
                    if state.gone:
                        continue
                if event is None:
                    self.threads.pop(state.tid, None)
                elif not isinstance(event, TrapStop):
                    other_events.append(event)

    def take_queued_signal(self, tid: int, trap: TrapStop) -> Event | None:
        """See queued_faults.py."""
        return queued_faults.take_queued_signal(self, tid, trap)

    def take_queued_signals(self) -> list[Event]:
        """See queued_faults.py."""
        return queued_faults.take_queued_signals(self)

    def wait_leader(self) -> Event | None:
        """The leader's stop, polled: a blocking wait for it never returns if the
        process exits meanwhile (a zombie leader is reported only once its other
        threads are reaped, by this same loop later); then it is marked gone."""
        # short polls first: the stop usually comes within 0.1-1 ms, and each ms spent
        # here is one of the target's pause (polls of 0.1 ms doubling to 2 ms made a
        # busy program wait 4-6 ms to be seen stopped)
        pause, deadline = 0.00005, time.monotonic() + 10
        while time.monotonic() < deadline:
            event = self.wait_event(block=False, tid=self.pid)
            if event is not None or self.pid not in self.threads:
                return event
            if not self._leader_alive():
                self.threads[self.pid].gone = True
                return None
            time.sleep(pause)
            pause = min(pause * 1.5, 0.001)
        return self.wait_event(block=True, tid=self.pid)

    def _leader_alive(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False

    def resume_all(self, except_tids=()) -> None:
        """Resume every stopped thread but ``except_tids`` (threads whose stop is still
        to be handled)."""
        for state in list(self.threads.values()):
            if not state.running and state.tid not in except_tids:
                self.resume(state.tid)

    # ------------------------------------------------------------------ leaving
    def detach(self) -> None:
        """Detach from every thread; each continues where it was, with its pending
        signal delivered. Safe to call in any state (threads may be running)."""
        self.stop_all_quietly()
        if self.call_page is not None and self.threads:
            try:
                self.call_page.release(self)
            except Exception as exc:        # it stays mapped; the next attach takes it out
                self.detach_problems.append(f"the call page: {type(exc).__name__}: {exc}")
        for tid, state in list(self.threads.items()):
            try:
                pr.detach(tid, state.pending_signal)
            except NoSuchProcessError:
                pass
            except OSError:
                pass
        self.threads.clear()
        self.mem.close()

    def stop_all_quietly(self) -> None:
        """stop_all, keeping the target's own signals pending for delivery at detach."""
        try:
            for event in self.stop_all():
                keep_signal(self.threads[event.tid], event)
        except NoSuchProcessError:
            pass

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        while self.threads:
            event = self.wait_event(block=True)
            if event is None:
                if not self.foreign:
                    break
                self.foreign.clear()
                continue
            if not isinstance(event, (ThreadExited, ThreadKilled)):
                # e.g. the PTRACE_EVENT_EXIT stop, which even SIGKILL passes through
                try:
                    pr.cont(event.tid, 0)
                except (NoSuchProcessError, OSError):
                    pass

    # ----------------------------------------------------------------- queries
    @property
    def threads_seen(self) -> int:
        return len(self.threads.seen)

    def auxv_entry(self) -> int:
        """AT_ENTRY: the executable's entry point (absolute; read once per image)."""
        if self._entry is None:
            with open(f"/proc/{self.pid}/auxv", "rb") as f:
                data = f.read()
            for key, value in struct.iter_unpack("<QQ", data):
                if key == AT_ENTRY:
                    self._entry = value
                    break
            else:
                raise TracerInternalError(f"process {self.pid} has no AT_ENTRY in its auxv")
        return self._entry

    def is_mapped(self, address: int) -> bool:
        """Whether ``address`` lies in a mapping of the process now (a fork child
        made before madtrace mapped its areas has none of them)."""
        with open(f"/proc/{self.pid}/maps", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                start, end = line.split(None, 1)[0].split("-")
                if int(start, 16) <= address < int(end, 16):
                    return True
        return False

    def get_regs(self, tid: int | None = None) -> pr.UserRegs:
        return pr.get_regs(self.pid if tid is None else tid)

    def set_regs(self, regs: pr.UserRegs, tid: int | None = None) -> None:
        pr.set_regs(self.pid if tid is None else tid, regs)
