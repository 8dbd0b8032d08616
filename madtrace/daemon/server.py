# SPDX-License-Identifier: GPL-2.0-or-later
"""The tracer daemon: ``start_daemon`` forks twice (setsid in between); the
grandchild attaches to the target and, being the tracer of every thread,
keeps tracing there: its main thread runs the run loop, a ``ControlServer``
thread serves the control socket.  The command-line process waits on a pipe
until the grandchild has attached (or failed, with its error) and returns.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import traceback
import threading

from ..errors import PermissionDeniedError, UsageError
from ..recording.recording import Recording, RecordOptions
from . import transport
from .detached import report, report_failure, start_detached
from ..live.session import LiveSession, Reply, end_message, failure
from ..live.parser import parse


class ControlServer:
    """Accepts connections of our own uid only; one thread per connection."""

    def __init__(self, pid: int, session: LiveSession | None = None):
        self.pid = pid
        self.session = session
        self.path = transport.socket_path(pid)
        self._closing = threading.Event()
        self._connections: dict[socket.socket, bool] = {}   # -> busy with a request
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        listener.listen(8)
        listener.settimeout(0.2)
        self.listener = listener

    def start(self, session: LiveSession) -> None:
        self.session = session
        thread = threading.Thread(target=self._accept_loop, name="madtrace-ctl", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(None)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                self._connections[conn] = False
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            uid = transport.peer_uid(conn)
            if uid != os.getuid():
                print(f"madtrace: refused a connection from uid {uid}", file=sys.stderr, flush=True)
                transport.send(conn, Reply(False, error=(
                    f"refused: the madtrace daemon of process {self.pid} serves uid {os.getuid()} "
                    f"only, and you are uid {uid}"), code=PermissionDeniedError.exit_code).to_dict())
                return
            transport.send(conn, {"hello": "madtrace", "pid": self.pid})
            reader = conn.makefile("rb")
            while not self._closing.is_set():
                message = transport.receive(reader)
                if message is None:
                    return
                with self._lock:
                    self._connections[conn] = True
                try:
                    reply = self.answer(message)
                    data = reply.to_dict()
                except Exception as exc:     # noqa: BLE001 - a reply, and the log says why
                    traceback.print_exc()
                    print(f"madtrace: internal error answering {message!r}: {exc!r}",
                          file=sys.stderr, flush=True)
                    reply = failure(exc)
                    data = reply.to_dict()
                transport.send(conn, data)
                with self._lock:
                    self._connections[conn] = False
                if reply.ended:
                    return
        except (OSError, ValueError) as exc:
            if not self._closing.is_set():
                print(f"madtrace: a client's connection ended: {exc!r}", file=sys.stderr,
                      flush=True)
            return
        finally:
            with self._lock:
                self._connections.pop(conn, None)
            conn.close()

    def answer(self, message) -> Reply:
        if not isinstance(message, dict):
            return failure(UsageError("a request is a JSON object: {\"line\": \"COMMAND\"}"))
        if "complete" in message:
            kind, word = message["complete"], message.get("word", "")
            if not isinstance(kind, str) or not isinstance(word, str):
                return failure(UsageError("a completion request names a kind and a word (strings)"))
            try:
                return Reply(True, data=self.session.complete(kind, word))
            except Exception as exc:
                return failure(exc)
        try:
            invocation = parse(str(message.get("line", "")))
            if invocation is None:
                return Reply(True)
            if invocation.command.side == "frontend":
                raise UsageError(f"{invocation.command.name} runs in the client, not in the daemon")
        except Exception as exc:
            return failure(exc)
        return self.session.submit(invocation)

    def unlink(self) -> None:
        """The socket's name goes (no new client finds it; those connected go on)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Stop accepting; let replies in flight go out; drop idle connections."""
        self._closing.set()
        self.listener.close()
        self.unlink()
        with self._lock:
            connections = dict(self._connections)
        for conn, busy in connections.items():
            if not busy:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for thread in list(self._threads):
            thread.join(5)


def _daemon_main(pid: int, options: RecordOptions, status_fd: int) -> int:
    """In the grandchild: attach, serve, trace; returns the process status."""
    server = None
    try:
        transport.ensure_runtime_dir()
        log = os.open(transport.log_path(pid), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        faulthandler.enable()   # a crash of the tracer itself leaves its stack in the log
        if transport.daemon_alive(pid):
            raise PermissionDeniedError(f"a madtrace daemon already traces process {pid}")
        server = ControlServer(pid)
        recording = Recording(options)
        recording.defer_while_stopped = True   # a live session (LiveSession): from the attach on
        recording.functions_after_attach = True    # (LiveSession.instrument_attach_patterns)
        recording.attach(pid)
        recording.functions_after_attach = False
    except BaseException as exc:
        if server is not None:
            server.close()
        return report_failure(status_fd, exc)
    session = LiveSession(recording)
    session.scratch["daemon"] = True
    # a client told "detached" finds no socket any more (it went after the reply before)
    session.before_end_replies.append(server.unlink)

    def serve():
        # once the target runs again (Controller.after_resume): starting the socket's
        # thread and waking the client cost 2-8 ms of the target's pause on a busy VM
        server.start(session)
        recording.log(f"daemon {os.getpid()} attached to process {pid} "
                      f"({recording.tracee.threads_seen} threads); socket {server.path}")
        report(status_fd, {"ok": True, "daemon": os.getpid(), "socket": server.path,
                           "log": transport.log_path(pid), "leftovers": recording.leftovers_line})
    recording.controller.after_resume.append(serve)
    try:
        status = recording.run(status_line=False)
        session.end(end_message(recording, status))
    except BaseException as exc:
        session.end(f"madtrace failed: {exc}")
        recording.log(f"daemon failed: {exc!r}\n{traceback.format_exc()}")
        raise
    finally:
        server.close()
    return 0


def start_daemon(pid: int, options: RecordOptions) -> dict:
    """Returns once the daemon is attached: {"daemon": its pid, "socket", "log"}.
    Raises the daemon's error (same message and exit code) if it could not attach."""
    options.output = os.path.abspath(options.output)

    def main(status_w: int) -> int:
        os.chdir("/")
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        return _daemon_main(pid, options, status_w)
    return start_detached(main, f"the daemon died before attaching (see {transport.log_path(pid)})")
