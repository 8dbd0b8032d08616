# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace daemon PID [-o DIR] [-f PATTERN]... | --resident | --stop-resident"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..errors import UsageError
from .options import parse_pid
from .options import add_recording_arguments, recording_options

if TYPE_CHECKING:       # the tracer is imported when the command runs
    from ..recording.recording import RecordOptions

NAME = "daemon"
HELP = ("attach to a running process and keep tracing it in the background; returns once "
        "attached. Control it with: madtrace ctl PID COMMAND (ctl PID stop ends it)")


def add_arguments(parser) -> None:
    parser.add_argument("pid", nargs="?", help="process to attach to")
    add_recording_arguments(parser, default_output="madtrace.data")
    parser.add_argument("--duration", type=float, metavar="SECONDS",
                        help="detach after this many seconds (the daemon ends)")
    resident = parser.add_mutually_exclusive_group()
    resident.add_argument("--resident", action="store_true",
                          help="start the resident madtrace process: it imports the tracer once "
                          "and forks the daemon of each later 'madtrace daemon PID' (faster "
                          "attach); it ends on SIGTERM or --stop-resident")
    resident.add_argument("--stop-resident", action="store_true",
                          help="end the resident madtrace process")


def start(pid: int, options: RecordOptions, how: str = "") -> int:
    """Start a daemon on ``pid`` (daemon and attach --daemon); returns once attached.
    ``how``: said after the log's name (how the daemon was started)."""
    from ..process.tracee import check_traceable
    from ..daemon.server import start_daemon
    from ..live.host import repl_options
    from ..daemon import resident
    check_traceable(pid)
    result = start_daemon(pid, repl_options(options))
    if result.get("leftovers"):
        print(f"madtrace: {result['leftovers']}", file=sys.stderr)
    if resident.in_worker:
        how = f"; forked by the resident process {resident.in_worker}"
    if not options.quiet:
        print(f"madtrace: daemon {result['daemon']} traces process {pid} (log {result['log']}"
              f"{how}); control it with: madtrace ctl {pid} COMMAND ('ctl {pid} stop' ends it)",
              file=sys.stderr)
    return 0


def run(args) -> int:
    from ..daemon import resident
    if args.resident or args.stop_resident:
        if args.pid is not None or args.target_command:
            raise UsageError("--resident and --stop-resident take no PID")
        return _resident(args.resident, args.quiet)
    if args.pid is None:
        raise UsageError("daemon needs a PID (or --resident)")
    if args.target_command:
        raise UsageError("daemon takes a PID, not a command after --")
    pid = parse_pid(args.pid)
    why = ""
    if not resident.in_worker:
        code, why = resident.run_in_resident(args.argv)
        if code is not None:
            return code
    return start(pid, recording_options(args, args.output),
                 how=f"; {why}: started here (madtrace daemon --resident makes attaching faster)"
                 if why else "")


def _resident(start_it: bool, quiet: bool) -> int:
    from ..daemon import resident
    if start_it:
        from .main import build_parser, main
        result = resident.start_resident(resident.CommandLine(
            main=main, daemon_options=lambda argv: build_parser("daemon").parse_args(argv)))
        if not quiet:
            state = "already runs" if result.get("running") else "is ready"
            print(f"madtrace: resident process {result['pid']} {state} ({result['socket']}); "
                  "'madtrace daemon PID' is forked from it; end it with: madtrace daemon "
                  "--stop-resident", file=sys.stderr)
        return 0
    pid = resident.stop_resident()
    if not quiet:
        print(f"madtrace: resident process {pid} ended" if pid is not None
              else "madtrace: no resident process runs", file=sys.stderr)
    return 0
