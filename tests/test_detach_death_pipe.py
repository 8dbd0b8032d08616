# SPDX-License-Identifier: GPL-2.0-or-later
"""A detach while another holder of the guard's death pipe exists.

An attached target holds the read end of a pipe whose only writer is
madtrace, with O_ASYNC and F_SETSIG SIGSEGV (data/guard.py
``watch_tracer``): madtrace's death signals the guard.  At detach the
target's fd was closed, then madtrace's end.  A vfork child holds a copy of
that fd (the same open file) from its vfork until its exit releases its file
table, which the kernel does after releasing its memory, the moment its
parent's vfork-done stop comes.  A detach that ran in that gap closed
madtrace's end while the child's copy was open (test_detach_vfork.py on a
loaded machine, both engines: 4 of 17 runs): the kernel sent the target
SIGSEGV (si_code SI_SIGIO), which the detach kept as the target's own and
delivered; the target died at the instruction after its vfork.

Here the test process holds the copy (pidfd_getfd: the same open file, as the
vfork child's), for as long as it likes: without the fix the target dies at
every detach."""

from __future__ import annotations

import ctypes
import os
import time

import pytest

from .test_daemon import run, start_daemon, wait_gone
from .util import prog, start_ready

SYS_PIDFD_GETFD = 438
O_ASYNC = 0o20000


def death_pipe_fd(pid: int) -> int:
    """The target's fd with O_ASYNC: the guard's end of the death pipe."""
    found = []
    for name in os.listdir(f"/proc/{pid}/fdinfo"):
        with open(f"/proc/{pid}/fdinfo/{name}") as f:
            flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
        if flags & O_ASYNC and os.readlink(f"/proc/{pid}/fd/{name}").startswith("pipe:"):
            found.append(int(name))
    assert len(found) == 1, found
    return found[0]


def hold_copy(pid: int, fd: int) -> int:
    """A copy of the target's ``fd`` in this process (the same open file)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        copy = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if copy < 0:
            pytest.fail(f"pidfd_getfd: {os.strerror(ctypes.get_errno())}")
        return copy
    finally:
        os.close(pidfd)


@pytest.mark.parametrize("engine", ["hybrid", "fault"])
def test_detach_leaves_no_signal_through_a_copy_of_the_death_pipe(tmp_path, engine, monkeypatch):
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", engine)
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    target = start_ready([prog("vfork_loop", "O0-pie"), "20000", "ready"])
    try:
        daemon = start_daemon(runtime, target.pid, tmp_path / "t")
        result = run(runtime, "ctl", str(target.pid), "trace", "data", "on")
        assert result.returncode == 0, result.stderr.decode()
        copy = hold_copy(target.pid, death_pipe_fd(target.pid))
        try:
            result = run(runtime, "ctl", str(target.pid), "stop")
            assert result.returncode == 0, result.stderr.decode()
            wait_gone(daemon)
            time.sleep(0.3)        # a signal sent at the detach has been delivered by now
            assert target.poll() is None, f"target died: {target.returncode}"
        finally:
            os.close(copy)
        time.sleep(0.1)
        assert target.poll() is None, f"target died once the copy was closed: {target.returncode}"
        out, _ = target.communicate(b"\n", timeout=60)
    finally:
        target.kill()
    assert target.returncode == 0, out
    assert out == b"rounds some checksum ok\n"
