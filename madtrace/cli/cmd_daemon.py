# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace daemon PID [-o DIR] [-f PATTERN]..."""

from __future__ import annotations

import sys

from ..errors import UsageError
from .cmd_repl import parse_pid
from .options import add_recording_arguments, recording_options

NAME = "daemon"
HELP = ("attach to a running process and keep tracing it in the background; returns once "
        "attached. Control it with: madtrace ctl PID COMMAND (ctl PID stop ends it)")


def add_arguments(parser) -> None:
    parser.add_argument("pid", help="process to attach to")
    add_recording_arguments(parser, default_output="madtrace.data")


def run(args) -> int:
    if args.target_command:
        raise UsageError("daemon takes a PID, not a command after --")
    pid = parse_pid(args.pid)
    from ..repl.daemon import start_daemon
    from ..repl.host import repl_options
    from ..process.tracee import check_traceable
    check_traceable(pid)
    result = start_daemon(pid, repl_options(recording_options(args, args.output)))
    if not args.quiet:
        print(f"madtrace: daemon {result['daemon']} traces process {pid} (log {result['log']}); "
              f"control it with: madtrace ctl {pid} COMMAND ('ctl {pid} stop' ends it)",
              file=sys.stderr)
    return 0
