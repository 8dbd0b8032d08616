# SPDX-License-Identifier: GPL-2.0-or-later
"""Whether a PID can be traced, said before any ptrace call."""

from __future__ import annotations

import os

from ..errors import KernelThreadError, NoSuchProcessError, PermissionDeniedError


def check_traceable(pid: int) -> None:
    """Clear errors for PIDs that cannot be traced, before any ptrace call."""
    if pid <= 0:
        raise NoSuchProcessError(f"invalid PID: {pid}")
    if pid == os.getpid():
        raise PermissionDeniedError("madtrace cannot trace itself")
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except FileNotFoundError:
        raise NoSuchProcessError(f"no such process: {pid}") from None
    except PermissionError:
        raise PermissionDeniedError(f"cannot read /proc/{pid}/status: permission denied") from None
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        exe = ""
    except PermissionError:
        raise PermissionDeniedError(f"cannot trace process {pid}: permission denied") from None
    if not exe and _is_kthread(pid):
        raise KernelThreadError(f"process {pid} is a kernel thread and cannot be traced")
    for line in status.splitlines():
        if line.startswith("TracerPid:") and int(line.split()[1]) != 0:
            tracer = int(line.split()[1])
            if tracer != os.getpid():
                raise PermissionDeniedError(f"process {pid} is already traced by process {tracer}")
        if line.startswith("State:") and line.split()[1] in ("Z", "X"):
            raise NoSuchProcessError(f"process {pid} is a zombie (already exited)")


def _is_kthread(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            flags = int(f.read().rsplit(")", 1)[1].split()[6])
        return bool(flags & 0x00200000)  # PF_KTHREAD
    except (OSError, IndexError, ValueError):
        return False
