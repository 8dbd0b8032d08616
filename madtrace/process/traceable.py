# SPDX-License-Identifier: GPL-2.0-or-later
"""Whether a PID can be traced, said before any ptrace call."""

from __future__ import annotations

import os
import time

from ..errors import KernelThreadError, NoSuchProcessError, PermissionDeniedError


# how long a tracer that was killed may take to let its tracees go (its last threads exit)
DYING_TRACER_WAIT = 5.0


def check_traceable(pid: int) -> None:
    """Clear errors for PIDs that cannot be traced, before any ptrace call."""
    if pid <= 0:
        raise NoSuchProcessError(f"invalid PID: {pid}")
    if pid == os.getpid():
        raise PermissionDeniedError("madtrace cannot trace itself")
    deadline = time.monotonic() + DYING_TRACER_WAIT
    while True:
        status = _status(pid)
        tracer = _tracer(status)
        # a tracer killed a moment ago: its main thread is gone, its others still exiting
        if not tracer or tracer == os.getpid() or not exiting(tracer) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.02)
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        exe = ""
    except PermissionError:
        raise PermissionDeniedError(f"cannot trace process {pid}: permission denied") from None
    if not exe and _is_kthread(pid):
        raise KernelThreadError(f"process {pid} is a kernel thread and cannot be traced")
    if tracer and tracer != os.getpid():
        raise PermissionDeniedError(f"process {pid} is already traced by process {tracer}")
    for line in status.splitlines():
        if line.startswith("State:") and line.split()[1] in ("Z", "X"):
            raise NoSuchProcessError(f"process {pid} is a zombie (already exited)")


def _status(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except FileNotFoundError:
        raise NoSuchProcessError(f"no such process: {pid}") from None
    except PermissionError:
        raise PermissionDeniedError(f"cannot read /proc/{pid}/status: permission denied") from None


def _tracer(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1])
    return 0


def exiting(pid: int) -> bool:
    """``pid``'s main thread has exited (or it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _is_kthread(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            flags = int(f.read().rsplit(")", 1)[1].split()[6])
        return bool(flags & 0x00200000)  # PF_KTHREAD
    except (OSError, IndexError, ValueError):
        return False
