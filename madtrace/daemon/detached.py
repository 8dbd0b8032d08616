# SPDX-License-Identifier: GPL-2.0-or-later
"""A background process started the way daemons are: fork, setsid, fork again;
the grandchild reports its start (a JSON object, ``{"ok": ...}``) through a
pipe, and the command that started it returns with that report."""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Callable

from ..errors import MadtraceError, TracerInternalError

INTERNAL_ERROR = 70


def start_detached(main: Callable[[int], int], died: str) -> dict:
    """Runs ``main(status_fd)`` in a detached grandchild (its own session); ``main``
    writes its report to ``status_fd`` and closes it, then runs on and returns
    its exit status.  Returns the report, or raises its error (same message and
    exit code); ``died``: the error when it ended without a report."""
    status_r, status_w = os.pipe()
    child = os.fork()
    if child == 0:
        code = INTERNAL_ERROR
        try:
            os.close(status_r)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            code = main(status_w)
        except BaseException:       # its log (stderr) says why the process ends here
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(status_w)
    os.waitpid(child, 0)
    chunks = []
    while True:
        chunk = os.read(status_r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(status_r)
    if not chunks:
        raise TracerInternalError(died)
    result = json.loads(b"".join(chunks))
    if not result["ok"]:
        error = MadtraceError(result["error"])
        error.exit_code = result["code"]
        raise error
    return result


def report(fd: int, message: dict) -> None:
    """The grandchild's report (once)."""
    os.write(fd, json.dumps(message).encode())
    os.close(fd)


def report_failure(fd: int, exc: BaseException) -> int:
    """The grandchild could not start: its error reported (the command raises it
    with the same message and exit code); returns that exit code."""
    code = exc.exit_code if isinstance(exc, MadtraceError) else INTERNAL_ERROR
    report(fd, {"ok": False, "error": str(exc), "code": code})
    return code
