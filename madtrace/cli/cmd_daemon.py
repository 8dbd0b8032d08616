# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace daemon PID [-o DIR] [-f PATTERN]..."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..errors import UsageError
from .cmd_repl import parse_pid
from .options import add_recording_arguments, recording_options

if TYPE_CHECKING:       # the tracer is imported when the command runs
    from ..session import RecordOptions

NAME = "daemon"
HELP = ("attach to a running process and keep tracing it in the background; returns once "
        "attached. Control it with: madtrace ctl PID COMMAND (ctl PID stop ends it)")


def add_arguments(parser) -> None:
    parser.add_argument("pid", help="process to attach to")
    add_recording_arguments(parser, default_output="madtrace.data")
    parser.add_argument("--duration", type=float, metavar="SECONDS",
                        help="detach after this many seconds (the daemon ends)")


def start(pid: int, options: RecordOptions) -> int:
    """Start a daemon on ``pid`` (daemon and attach --daemon); returns once attached."""
    from ..process.tracee import check_traceable
    from ..repl.daemon import start_daemon
    from ..repl.host import repl_options
    check_traceable(pid)
    result = start_daemon(pid, repl_options(options))
    if result.get("leftovers"):
        print(f"madtrace: {result['leftovers']}", file=sys.stderr)
    if not options.quiet:
        print(f"madtrace: daemon {result['daemon']} traces process {pid} (log {result['log']}); "
              f"control it with: madtrace ctl {pid} COMMAND ('ctl {pid} stop' ends it)",
              file=sys.stderr)
    return 0


def run(args) -> int:
    if args.target_command:
        raise UsageError("daemon takes a PID, not a command after --")
    return start(parse_pid(args.pid), recording_options(args, args.output))
