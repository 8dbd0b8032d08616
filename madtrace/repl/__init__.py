# SPDX-License-Identifier: GPL-2.0-or-later
"""Interactive control of a live recording: the REPL, batch files and the daemon.

- ``registry``: the ``Command`` base class and the table of commands
  (``commands/``: one module per command, each registering itself);
- ``parser``: one line -> an ``Invocation`` (one-line errors otherwise);
- ``live``: ``LiveSession``, the tracer thread's side: commands queued by
  any thread run inside the run loop at a safe stop, then the target resumes;
- ``frontend``: the prompt_toolkit REPL (history, completion) and batch mode,
  over a backend (the in-process session, or a daemon through its socket);
- ``host``: runs a recording with a front end; ``transport`` and ``daemon``:
  the per-user control socket, its server and its client.
"""
