"""A tracer killed while a thread is lent to remote system calls: the thread
gets its own registers back (process/call_page.py) and the program goes on.

Before the call page, a remote call ran at a ``syscall; int3`` written over the
executable's entry point: a tracer killed during a scope left the thread with
the call's registers, running into the int3 (SIGTRAP: a core dump) or, where
madtrace's guard swallowed it, into the start-up code (the program started
again).  Here a tracer process attaches, opens a scope in the main thread
(blocked in read(), so its call must also be restarted) and kills itself with
SIGKILL at the k-th stop of that scope, for every k the scope has: between
two calls, at a call's entry stop, at its exit stop, before the thread is
back in its own stop.  Oracle: the program still reads the line sent after
and prints it, exit status 0, and nothing of madtrace is left that could run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from .util import prog

TRACER = textwrap.dedent("""
    import os, signal, sys
    from madtrace.process import ptrace_raw as pr
    from madtrace.process import remote_syscall
    from madtrace.process.remote_syscall import RemoteSyscalls, MAP_PRIVATE, MAP_ANONYMOUS
    from madtrace.process.tracee import Tracee
    pid, die_at = int(sys.argv[1]), int(sys.argv[2])
    tracee = Tracee.attach(pid)
    with RemoteSyscalls(tracee) as rs:        # maps the call page (not covered)
        rs.getpid()
    resumes = [0]
    def counted(real):
        def resume(tid, sig=0):
            resumes[0] += 1
            if resumes[0] == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            real(tid, sig)
            if resumes[0] == die_at + 100:     # never: the scope has fewer stops
                raise SystemExit(2)
        return resume
    pr.syscall, pr.cont = counted(pr.syscall), counted(pr.cont)
    remote_syscall.pr = pr
    with RemoteSyscalls(tracee) as rs:
        address = rs.mmap(0, 4096, 3, MAP_PRIVATE | MAP_ANONYMOUS)
        assert rs.getpid() == pid
        rs.munmap(address, 4096)
    print("survived", resumes[0], flush=True)
""")


def _tracer(pid: int, die_at: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run([sys.executable, "-c", TRACER, str(pid), str(die_at)], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-pie"])
def test_a_lent_thread_survives_its_tracer(variant):
    # the stops of the second scope: three calls (entry and exit each, and a
    # skipped call's exit first, lent from an interrupt stop inside read()),
    # then back to its own stop through a PTRACE_INTERRUPT trap
    survived = None
    die_at = 1
    while survived is None:
        target = subprocess.Popen([prog("blocking", variant), "read"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert target.stdout.readline() == b"ready\n"
            tracer = _tracer(target.pid, die_at)
            if tracer.returncode == 0:
                survived = die_at      # no stop left to die at: every one was tried
            else:
                assert tracer.returncode == -signal.SIGKILL, tracer.stderr
            out, err = target.communicate(b"hello\n", timeout=30)
        finally:
            if target.poll() is None:
                target.kill()
                target.wait()
        assert (target.returncode, out) == (0, b"got 6 bytes: hello\n"), \
            f"killed at stop {die_at}: exit {target.returncode}, {out!r}, {err[-300:]!r}"
        die_at += 1
    assert survived > 6, f"the scope had only {survived - 1} stops to die at"
