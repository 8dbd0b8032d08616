# SPDX-License-Identifier: GPL-2.0-or-later
"""Run a recording with a front end: the tracer (this, the main thread) runs
the run loop and the commands; the front end runs in its own thread."""

from __future__ import annotations

import threading

from ..recording.recording import RecordOptions
from .frontend import InteractiveFrontend, LocalBackend, make_frontend
from .session import LiveSession, end_message


def repl_options(options: RecordOptions) -> RecordOptions:
    """In a REPL, functions are instrumented on request: only -f ones at start."""
    options.trace_functions = bool(options.functions)
    return options


def run_with_frontend(recording, batch: str | None = None) -> int | None:
    """``recording`` is launched or attached; returns what ``Recording.run`` returns."""
    frontend = make_frontend(batch)
    session = LiveSession(recording)
    session.on_end.append(frontend.session_ended)
    backend = LocalBackend(session)

    def front():
        try:
            frontend.run(backend)
        finally:
            if session.ended_message is None:  # the front end is gone: do not trace forever
                session.stop_soon("repl closed")

    if isinstance(frontend, InteractiveFrontend):
        # Ctrl-C while a command runs cancels it; at the prompt the terminal is raw
        # (no signal); a SIGINT from elsewhere detaches, as without a REPL
        recording.controller.on_interrupt = frontend.interrupt
    thread = threading.Thread(target=front, name="madtrace-repl", daemon=True)
    thread.start()
    try:
        status = recording.run(status_line=False)
    except BaseException as exc:
        session.end(f"madtrace failed: {exc}")
        thread.join(5)
        raise
    session.end(end_message(recording, status))
    thread.join()
    return status
