# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace repl PID [-o DIR] [-f PATTERN]... [--batch FILE]
madtrace repl --connect PID [--batch FILE]"""

from __future__ import annotations

from ..errors import UsageError
from .options import add_recording_arguments, parse_pid, recording_options

NAME = "repl"
HELP = ("attach to a running process and control it interactively (instrument, restore, "
        "calls, x, regs...); --connect PID talks to a madtrace daemon instead")


def add_arguments(parser) -> None:
    parser.add_argument("pid", nargs="?", help="process to attach to")
    parser.add_argument("--connect", metavar="PID",
                        help="control the madtrace daemon that traces PID")
    parser.add_argument("--batch", metavar="FILE",
                        help="run the commands of FILE (REPL grammar, one per line), then detach")
    add_recording_arguments(parser, default_output=None)


def run(args) -> int:
    from ..live.frontend import make_frontend
    if args.target_command:
        raise UsageError("repl takes a PID; to launch a command use: madtrace --repl -- CMD")
    if args.connect is not None:
        if args.pid is not None:
            raise UsageError("give either a PID to attach to or --connect PID, not both")
        from ..daemon.transport import DaemonClient
        client = DaemonClient(parse_pid(args.connect))
        frontend = make_frontend(args.batch)
        try:
            frontend.run(client)
        finally:
            client.close()
        return 1 if frontend.failures and args.batch else 0
    if args.pid is None:
        raise UsageError("repl needs a PID (or --connect PID)")
    pid = parse_pid(args.pid)
    from ..live.host import repl_options, run_with_frontend
    from ..recording.recording import Recording
    from ..trace import store       # numpy: imported once a session starts
    output = args.output or store.default_trace_dir()
    recording = Recording(repl_options(recording_options(args, output)))
    recording.attach(pid)
    recording.log(f"attached to process {pid} ({recording.tracee.threads_seen} threads)")
    status = run_with_frontend(recording, args.batch)
    return 0 if status is None else status
