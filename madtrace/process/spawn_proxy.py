# SPDX-License-Identifier: GPL-2.0-or-later
"""A program to launch that another process forked: ``madtrace-ctl record``.

``madtrace-ctl record ... -- CMD ARGS`` (madtrace/cli/madtrace_ctl.c) with a
resident madtrace process listening forks the program itself, in the user's
session, process group and terminal, with its own file descriptors, limits
and signal state; the child waits on a pipe before exec.  The resident's
worker runs the ``record`` command line, and ``Tracee.spawn`` takes that
child instead of forking one (``take``): it seizes it, writes the resolved
path of CMD into the pipe and closes it, and the child execs that path (as
the child ``Tracee.spawn`` forks would), reporting a failed exec's errno on
the second pipe (close-on-exec).  The child never execs when the pipe closes
without a path (the command failed before launching): it exits 127.

The worker is not the program's parent: ptrace's stops and its exit reach
it as the tracer, and the client, its parent, reaps it after.
"""

from __future__ import annotations

import os


class ProxyChild:
    def __init__(self, pid: int, go_fd: int, err_fd: int):
        self.pid = pid
        self.go_fd = go_fd      # the child reads the path to exec from here until EOF
        self.err_fd = err_fd    # the child writes a failed exec's errno here (4 bytes)

    def release(self) -> None:
        """Not launched (the command failed before): the child exits, never execs."""
        for fd in (self.go_fd, self.err_fd):
            try:
                os.close(fd)
            except OSError:
                pass


_offered: ProxyChild | None = None


def offer(child: ProxyChild) -> None:
    """In the resident's worker: the child the client forked, for the next launch."""
    global _offered
    _offered = child


def take() -> ProxyChild | None:
    """The offered child (once), or None: the launch forks its own."""
    global _offered
    child, _offered = _offered, None
    return child
