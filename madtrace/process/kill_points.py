# SPDX-License-Identifier: GPL-2.0-or-later
"""Kill points: a test facility for "the tracer killed at any moment".

``MADTRACE_TEST_KILL_AT=POINT:N`` makes the tracer SIGKILL itself the Nth time
it reaches POINT (N defaults to 1), after one line on stderr that says where:

* a remote system call's name (``mprotect``, ``munmap``...): the call is about
  to run, the thread lent with the call's registers (remote_syscall.py);
* ``breakpoint``, ``return-trap``: a hook's breakpoint or return trap was hit
  and its stop taken (the kernel will not deliver that SIGTRAP again),
  nothing done yet (data/heap/call_hooks.py).

A program traced when the tracer dies at any of them must finish as it would
have (tests/test_tracer_killed.py).  Read once at start; unset, a kill point
is one comparison.
"""

from __future__ import annotations

import os
import signal

_AT = os.environ.get("MADTRACE_TEST_KILL_AT")
_reached: dict[str, int] = {}


def kill_point(point: str, detail: str = "") -> None:
    if _AT is None:
        return
    name, _, nth = _AT.partition(":")
    if point != name:
        return
    _reached[point] = _reached.get(point, 0) + 1
    if _reached[point] == int(nth or 1):
        os.write(2, f"madtrace: test kill at {point} #{_reached[point]} ({detail})\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
