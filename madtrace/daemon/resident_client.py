# SPDX-License-Identifier: GPL-2.0-or-later
"""The client side of the resident madtrace process (resident.py): what
``madtrace daemon PID ...`` runs first, before the command line's parser and
the tracer are imported, so that a command the resident runs costs a Python
start-up and little more.  The standard library's os, socket and json only.

``run_in_resident(argv)`` hands the command line, working directory,
environment, umask and stdin/stdout/stderr (SCM_RIGHTS) to the resident, which
forks a worker that runs that same command line; its exit code comes back.
``in_worker`` is set in such a worker (the command it runs must not ask the
resident again).
"""

from __future__ import annotations

import json
import os
import socket
import sys

from ..errors import TracerInternalError

SOCKET_NAME = "resident.sock"
LOG_NAME = "resident.log"
# in a worker: the resident's pid
in_worker = 0


def runtime_dir() -> str:
    """The directory of the daemons' and the resident's sockets and logs
    (transport.py: its modes and checks)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(base, "madtrace") if base else f"/tmp/madtrace-{os.getuid()}"


def socket_path() -> str:
    return os.path.join(runtime_dir(), SOCKET_NAME)


def package_dir() -> str:
    """The madtrace package this runs from (a resident runs only its own)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def connect() -> socket.socket | None:
    """A connection to the resident process (None: none listens; a socket left
    by a resident that died is removed)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_path())
    except ConnectionRefusedError:
        sock.close()
        try:
            os.unlink(socket_path())
        except OSError:
            pass
        return None
    except OSError:
        sock.close()
        return None
    return sock


def run_in_resident(argv: list[str]) -> tuple[int | None, str]:
    """Runs ``madtrace ARGV`` in a worker of the resident process.  Returns (its
    exit code, "") or (None, why not) when there is no resident to run it."""
    sock = connect()
    if sock is None:
        return None, "no resident madtrace process"
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        umask = os.umask(0)
        os.umask(umask)
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": umask,
                   "package": package_dir(), "python": sys.executable}
        socket.send_fds(sock, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        reader = sock.makefile("rb")
        line = reader.readline()
    except OSError as exc:
        return None, f"the resident madtrace process did not answer ({exc.strerror})"
    finally:
        sock.close()
    if not line:
        raise TracerInternalError("the resident madtrace process failed while running the "
                                  f"command (see {os.path.join(runtime_dir(), LOG_NAME)})")
    reply = json.loads(line)
    if "refused" in reply:
        return None, reply["refused"]
    return int(reply["exit"]), ""


def ask(message: dict) -> dict | None:
    """One request to the resident process and its answer (None: no resident)."""
    sock = connect()
    if sock is None:
        return None
    try:
        sock.sendall(json.dumps(message).encode() + b"\n")
        line = sock.makefile("rb").readline()
    finally:
        sock.close()
    return json.loads(line) if line else None
