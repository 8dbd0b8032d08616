# SPDX-License-Identifier: GPL-2.0-or-later
"""Where the user is: the interactive REPL (prompt_toolkit: history, Tab
completion of commands, function, variable and thread names) and batch mode
(the same grammar from a file), over a backend:

- ``LocalBackend``: the ``LiveSession`` of this process (the REPL runs in its
  own thread; the tracer thread runs the commands);
- ``transport.DaemonClient``: a daemon's session, through its socket.

A backend has ``execute(invocation) -> Reply``, ``complete(kind, word)``
and ``owns_session`` (whether leaving the REPL detaches).
"""

from __future__ import annotations

import json
import os
import sys
import threading

from ..errors import MadtraceError
from .session import LiveSession, Reply
from .parser import Invocation, parse
from . import registry

PROMPT = "madtrace> "


class LocalBackend:
    owns_session = True

    def __init__(self, session: LiveSession):
        self.session = session

    def execute(self, invocation: Invocation) -> Reply:
        return self.session.submit(invocation)

    def complete(self, kind: str | None, word: str) -> list[str]:
        try:
            return self.session.complete(kind, word)
        except Exception:  # a snapshot changed under us: no completion this time
            return []


class Frontend:
    """Runs lines through the parser and the backend; prints replies."""

    def __init__(self, out=None, err=None):
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.done = False          # the session ended, or the user left
        self.end_message: str | None = None
        self.end_printed = False
        self.backend = None
        self.failures = 0
        self.busy = False                    # a command is running
        self.interrupted = threading.Event()    # Ctrl-C while it ran

    def interrupt(self) -> bool:
        """Ctrl-C: the command running is cancelled (True), none runs (False).
        A command the tracer already runs finishes (its reply is waited for):
        only waits of the front end (sleep) are cut short."""
        if not self.busy:
            return False
        self.interrupted.set()
        return True

    def error(self, message: str, where: str = "") -> None:
        self.failures += 1
        print(f"error: {where}{message}", file=self.err, flush=True)

    def quit(self) -> None:
        """The quit command: detach when we own the session, else just leave."""
        if self.backend.owns_session:
            self.run_line("detach")
        self.done = True

    def run_line(self, line: str, where: str = "") -> None:
        self.interrupted.clear()
        self.busy = True
        try:
            self._run_line(line, where)
        finally:
            self.busy = False

    def _run_line(self, line: str, where: str = "") -> None:
        try:
            invocation = parse(line)
        except MadtraceError as exc:
            self.error(str(exc), where)
            return
        if invocation is None:
            return
        command = invocation.command
        if command.side == "frontend":
            try:
                text = command.run_frontend(self, invocation.args)
            except MadtraceError as exc:
                self.error(str(exc), where)
                return
            if text:
                print(text, file=self.out, flush=True)
            return
        reply = self.backend.execute(invocation)
        if not reply.ok:
            self.error(reply.error, where)
        elif invocation.json:
            print(json.dumps(reply.data), file=self.out, flush=True)
        elif reply.text:
            print(reply.text, file=self.out, flush=True)
        if reply.ended:
            self.done = True
            self.end_message = reply.text or reply.error
            self.end_printed = True

    def session_ended(self, message: str) -> None:
        """Called from the tracer thread when the recording is over."""
        self.end_message = self.end_message or message
        self.done = True


class BatchFrontend(Frontend):
    """Commands from a file (or stdin), one per line; errors name the line and
    the next line runs. At the end, a session we own is detached."""

    def __init__(self, lines, name: str = "", **kw):
        super().__init__(**kw)
        self.lines = lines
        self.name = name

    def run(self, backend) -> None:
        self.backend = backend
        for number, line in enumerate(self.lines, 1):
            if self.done:
                if line.strip() and not line.lstrip().startswith("#"):
                    self.error("the session has ended", f"{self.name}:{number}: ")
                continue
            self.run_line(line.rstrip("\n"), f"{self.name}:{number}: ")
        if not self.done and backend.owns_session:
            backend.execute(parse("detach"))   # stdout keeps only the commands' output
            self.done = True


class InteractiveFrontend(Frontend):
    """prompt_toolkit REPL; safe to run in a thread other than the main one."""

    def __init__(self, history_path: str | None = None, **kw):
        super().__init__(**kw)
        self.history_path = history_path
        self._app = None
        self._lock = threading.Lock()

    def session_ended(self, message: str) -> None:
        super().session_ended(message)
        with self._lock:
            app = self._app
        if app is not None and app.is_running:
            app.loop.call_soon_threadsafe(lambda: app.is_running and app.exit(exception=EOFError()))

    def run(self, backend) -> None:
        from prompt_toolkit import PromptSession

        from .completion import CommandCompleter
        self.backend = backend
        session = PromptSession(history=_history(self.history_path),
                                completer=CommandCompleter(backend),
                                complete_while_typing=False)
        with self._lock:
            self._app = session.app
        # no patch_stdout: replies are printed between prompts, by this thread
        print("madtrace REPL: 'help' lists the commands, Ctrl-D leaves", file=self.out, flush=True)
        while not self.done:
            try:
                line = session.prompt(PROMPT, pre_run=self._exit_if_done)
            except KeyboardInterrupt:
                continue
            except EOFError:
                if not self.done:
                    self.quit()
                break
            try:
                self.run_line(line)
            except KeyboardInterrupt:       # a client's Ctrl-C: that command only
                self.error("interrupted")
        if self.end_message and not self.end_printed:
            print(f"madtrace: {self.end_message}", file=sys.stderr, flush=True)

    def _exit_if_done(self) -> None:
        if self.done:
            self._app.exit(exception=EOFError())


def _history(path: str | None):
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    if path is None:
        state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
        path = os.path.join(state, "madtrace", "history")
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "a"):
            pass
        return FileHistory(path)
    except OSError:
        return InMemoryHistory()


def make_frontend(batch: str | None):
    """Batch from a file; batch from stdin when it is not a terminal; else the REPL."""
    if batch is not None:
        try:
            with open(batch) as f:
                lines = f.readlines()
        except OSError as exc:
            from ..errors import UsageError
            raise UsageError(f"cannot read batch file {batch}: {exc.strerror}") from None
        return BatchFrontend(lines, name=os.path.basename(batch))
    if not sys.stdin.isatty():
        return BatchFrontend(sys.stdin.readlines(), name="stdin")
    return InteractiveFrontend()


__all__ = ["BatchFrontend", "InteractiveFrontend", "LocalBackend", "make_frontend", "registry"]
