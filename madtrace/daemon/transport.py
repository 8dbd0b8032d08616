# SPDX-License-Identifier: GPL-2.0-or-later
"""The daemon's control socket: where it lives, the messages, the client.

Each daemon listens on ``<runtime dir>/<PID>.sock`` where the runtime dir is
``$XDG_RUNTIME_DIR/madtrace`` or ``/tmp/madtrace-<uid>`` (mode 0700, ours,
not a symlink; the socket is 0600).  Messages are JSON objects, one per
line.  On connection the server checks the peer's uid (SO_PEERCRED) and
answers ``{"hello": ...}`` or a refusal; then each request ``{"line": ...}``
or ``{"complete": KIND, "word": ...}`` gets one reply (``live.Reply``).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import struct

from ..process.traceable import exiting
from ..errors import NoSuchProcessError, PermissionDeniedError, TracerInternalError
from ..live.reply import Reply
from ..live.parser import Invocation
from .resident_client import runtime_dir


def ensure_runtime_dir() -> str:
    """Create the runtime dir (0700) or check that the existing one is safe."""
    path = runtime_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionDeniedError(
            f"unsafe runtime directory {path}: it must be a directory of uid {os.getuid()} "
            f"with mode 0700 (it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
    return path


def socket_path(pid: int) -> str:
    return os.path.join(runtime_dir(), f"{pid}.sock")


def log_path(pid: int) -> str:
    return os.path.join(runtime_dir(), f"{pid}.log")


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def receive(reader) -> dict | None:
    line = reader.readline()
    if not line:
        return None
    return json.loads(line)


def daemon_alive(pid: int) -> bool:
    """Is a daemon listening for process ``pid``? A stale socket is removed (that
    of a daemon that died, or that is dying: killed, its last threads still
    exiting while they hold the listening socket)."""
    path = socket_path(pid)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        listener = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))[0]
        if not exiting(listener):
            return True
        os.unlink(path)
        return False
    except FileNotFoundError:
        return False
    except ConnectionRefusedError:
        os.unlink(path)   # left by a daemon that died
        return False
    finally:
        probe.close()



class DaemonClient:
    """A connection to the daemon that traces process ``pid``."""

    owns_session = False

    def __init__(self, pid: int, timeout: float | None = None):
        self.pid = pid
        path = socket_path(pid)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except FileNotFoundError:
            sock.close()
            raise NoSuchProcessError(f"no madtrace daemon traces process {pid} "
                                     f"(no socket {path})") from None
        except ConnectionRefusedError:
            sock.close()
            os.unlink(path)
            raise NoSuchProcessError(f"no madtrace daemon traces process {pid}: its daemon died; "
                                     f"removed the stale socket {path}") from None
        except PermissionError:
            sock.close()
            raise PermissionDeniedError(
                f"permission denied: the madtrace daemon of process {pid} belongs to another "
                f"user ({path} is not accessible to uid {os.getuid()})") from None
        except OSError as exc:
            sock.close()
            raise TracerInternalError(f"cannot connect to {path}: {exc.strerror}") from None
        sock.settimeout(timeout)
        self.sock = sock
        self.reader = sock.makefile("rb")
        hello = self._receive()
        if not hello.get("hello"):
            self.close()
            raise PermissionDeniedError(hello.get("error") or "refused by the daemon")

    def _receive(self) -> dict:
        try:
            message = receive(self.reader)
        except TimeoutError:
            raise NoSuchProcessError(
                f"the madtrace daemon of process {self.pid} did not answer within "
                f"{self.sock.gettimeout():.0f} s (its log: {log_path(self.pid)})") from None
        except (OSError, ValueError):
            message = None
        if message is None:
            raise NoSuchProcessError(f"the madtrace daemon of process {self.pid} closed the connection")
        return message

    def request(self, message: dict) -> dict:
        try:
            send(self.sock, message)
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET):
                raise NoSuchProcessError(
                    f"the madtrace daemon of process {self.pid} has ended") from None
            raise
        return self._receive()

    def execute(self, invocation: Invocation) -> Reply:
        try:
            return Reply.from_dict(self.request({"line": invocation.for_daemon()}))
        except NoSuchProcessError as exc:
            return Reply(False, error=str(exc), code=exc.exit_code, ended=True)

    def complete(self, kind: str | None, word: str) -> list[str]:
        try:
            return self.request({"complete": kind, "word": word}).get("data") or []
        except Exception:
            return []

    def close(self) -> None:
        try:
            self.reader.close()
            self.sock.close()
        except OSError:
            pass
