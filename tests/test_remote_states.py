"""System calls run inside the target in every state a thread can be stopped in.

A thread stopped inside clone (PTRACE_EVENT_CLONE) used to run the gadget with
rax overwritten by clone's result (ENOSYS) and lose clone's result when its
registers were put back: pthread_create failed and a live server died.  Here a
program that creates threads, forks, vforks+execs, blocks in read() and in
nanosleep all the time runs under PTRACE_SYSCALL, and at each of its stops
(event stops, syscall entry and exit, signal stops, new threads' first stops,
exiting threads) system calls are run in that very thread, and, every few
stops, with every thread stopped in a thread RemoteSyscalls chooses.  Oracle:
the program checks each of its own results and its output equals an untraced
run; each scope's calls return what they must."""

from __future__ import annotations

import collections
import os
import tempfile

import pytest

from madtrace.errors import TracerInternalError
from madtrace.process import ptrace_raw as pr
from madtrace.process.controller import Controller
from madtrace.process.events import (GroupStop, PtraceEventStop, SignalStop, SyscallStop,
                                     ThreadExited, ThreadKilled, TrapStop)
from madtrace.process.remote_syscall import (MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE,
                                             READY, RemoteSyscalls, stop_kind)
from madtrace.process.tracee import Tracee

from .util import prog, run_untraced

ROUNDS = "120"


def _label(tracee: Tracee, event) -> str:
    if isinstance(event, PtraceEventStop):
        return {pr.PTRACE_EVENT_CLONE: "clone", pr.PTRACE_EVENT_FORK: "fork",
                pr.PTRACE_EVENT_VFORK: "vfork", pr.PTRACE_EVENT_VFORK_DONE: "vfork-done",
                pr.PTRACE_EVENT_EXEC: "exec", pr.PTRACE_EVENT_EXIT: "exit"}[event.event]
    if isinstance(event, SyscallStop):
        op = pr.get_syscall_info(event.tid).op
        return "syscall-entry" if op == pr.SYSCALL_INFO_ENTRY else "syscall-exit"
    if isinstance(event, SignalStop):
        return "signal"
    if isinstance(event, TrapStop):
        return "new-thread" if tracee.threads[event.tid].fresh else "interrupt"
    assert isinstance(event, GroupStop)
    return "group-stop"


def _exercise(tracee: Tracee, rs: RemoteSyscalls) -> None:
    assert rs.getpid() == tracee.pid
    assert rs.call("gettid") == rs.tid
    addr = rs.mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
    tracee.mem.write(addr, b"madtrace")
    assert tracee.mem.read(addr, 8) == b"madtrace"
    assert rs.munmap(addr, 8192) == 0


def _run_in(tracee: Tracee, tid: int) -> None:
    """A scope in thread ``tid``; registers exactly as before when it was ready as it was."""
    state = tracee.threads[tid]
    ready = stop_kind(state) == READY
    before = pr.get_regs(tid)
    with RemoteSyscalls(tracee, tid) as rs:
        _exercise(tracee, rs)
    if ready:
        after = pr.get_regs(tid)
        assert after == before, {k: (hex(v), hex(before.as_dict()[k])) for k, v in after.as_dict().items() if v != before.as_dict()[k]}


def _launch_to_file(argv: list[str], out_path: str) -> Tracee:
    """Tracee.spawn with the program's stdout going to ``out_path``."""
    saved = os.dup(1)
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 1)
        return Tracee.spawn(argv)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(fd)


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-pie"])
def test_remote_syscalls_in_every_thread_state(variant):
    argv = [prog("churn", variant), ROUNDS]
    expected = run_untraced(argv).stdout
    seen: collections.Counter = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "out")
        tracee = _launch_to_file(argv, out_path)
        # stopped in execve's PTRACE_EVENT_EXEC: finished to its exit stop first
        assert _label(tracee, tracee.threads[tracee.pid].last_event) == "exec"
        _run_in(tracee, tracee.pid)
        seen["exec"] += 1
        controller = Controller(tracee)
        tracee.trace_syscalls = True
        tracee.resume_all()
        rewound: set[int] = set()   # threads whose syscall entry was just rewound

        def visit(event) -> None:
            """A scope in the thread of ``event``, at that stop."""
            label = _label(tracee, event)
            if label in ("vfork", "exit"):
                # a vfork parent would wait for its child; an exiting thread cannot run code
                with pytest.raises(TracerInternalError, match="cannot run a system call"):
                    with RemoteSyscalls(tracee, event.tid):
                        pass
                seen[label] += 1
            elif label == "syscall-entry" and event.tid in rewound:
                rewound.discard(event.tid)    # the call made again after a rewind: let it run
            else:
                _run_in(tracee, event.tid)
                seen[label] += 1
                if label == "syscall-entry":
                    rewound.add(event.tid)

        stops = 0
        while True:
            event = tracee.wait_event(block=True)
            controller._route_foreign()
            if tracee.exit_event is not None and not tracee.threads:
                break
            if event is None or isinstance(event, (ThreadExited, ThreadKilled)):
                continue
            stops += 1
            visit(event)
            controller.handle(event)
            if stops % 5 == 0:
                # as a live command does: every thread stopped, then a thread chosen
                others = [e for e in tracee.stop_all() if e.tid in tracee.threads]
                for other in others:
                    visit(other)
                labels = {t: _label(tracee, s.last_event) for t, s in tracee.threads.items()
                          if s.last_event is not None and not s.gone}
                if all(stop_kind(tracee.threads[t]) is None for t in labels):
                    # e.g. the last thread in its exit stop: refused, nothing changed
                    with pytest.raises(TracerInternalError, match="can run a system call"):
                        with RemoteSyscalls(tracee):
                            pass
                else:
                    with RemoteSyscalls(tracee) as rs:
                        _exercise(tracee, rs)
                    seen["chosen-" + labels[rs.tid]] += 1
                for other in others:
                    if other.tid in tracee.threads and not tracee.threads[other.tid].running:
                        controller.handle(other)
                tracee.resume_all()
        assert tracee.exit_event == ThreadExited(tracee.pid, 0)
        with open(out_path, "rb") as f:
            assert f.read() == expected
    for label in ("exec", "clone", "fork", "vfork", "vfork-done", "exit", "syscall-entry",
                  "syscall-exit", "signal", "new-thread"):
        # a scope at the stop itself or in a thread chosen while it was in that stop: a
        # new thread's first stop is met either way, as the scheduler orders the stops
        assert seen[label] + seen["chosen-" + label] > 0, f"no scope in a {label} stop: {dict(seen)}"
    assert sum(v for k, v in seen.items() if k.startswith("chosen-")) > 20, dict(seen)
