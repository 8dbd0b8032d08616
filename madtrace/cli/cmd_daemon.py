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
                          "attach); it ends on SIGTERM or --stop-resident. Without one, "
                          "'madtrace daemon PID' starts one for the next commands, which ends "
                          "after MADTRACE_RESIDENT_IDLE seconds unused (600; 0: none)")
    parser.add_argument("--idle", type=float, metavar="SECONDS",
                        help="with --resident: it ends after SECONDS without a command")
    resident.add_argument("--stop-resident", action="store_true",
                          help="end the resident madtrace process")


def start(pid: int, options: RecordOptions, how: str = "") -> int:
    """Start a daemon on ``pid`` (daemon and attach --daemon); returns once attached.
    ``how``: said after the log's name (how the daemon was started)."""
    from ..process.tracee import check_traceable
    from ..daemon.server import start_daemon
    from ..live.host import repl_options
    from ..daemon import resident_client
    check_traceable(pid)
    result = start_daemon(pid, repl_options(options))
    if result.get("leftovers"):
        print(f"madtrace: {result['leftovers']}", file=sys.stderr)
    if resident_client.in_worker:
        how = f"; forked by the resident process {resident_client.in_worker}"
    if not options.quiet:
        print(f"madtrace: daemon {result['daemon']} traces process {pid} (log {result['log']}"
              f"{how}); control it with: madtrace ctl {pid} COMMAND ('ctl {pid} stop' ends it)",
              file=sys.stderr)
    return 0


def run(args) -> int:
    from ..daemon import resident, resident_client
    if args.resident or args.stop_resident:
        if args.pid is not None or args.target_command:
            raise UsageError("--resident and --stop-resident take no PID")
        if args.idle is not None and (args.stop_resident or not args.idle > 0):
            raise UsageError("--idle SECONDS (more than 0) goes with --resident")
        return _resident(args.resident, args.quiet, args.idle or 0.0)
    if args.pid is None:
        raise UsageError("daemon needs a PID (or --resident)")
    if args.target_command:
        raise UsageError("daemon takes a PID, not a command after --")
    if args.idle is not None:
        raise UsageError("--idle goes with --resident")
    pid = parse_pid(args.pid)
    if resident_client.in_worker:
        return start(pid, recording_options(args, args.output))
    why = args.not_resident     # the resident was asked first (cli/main.py through_resident)
    idle = resident.on_demand_idle()
    later = (f"; one starts for the next commands (it ends after {idle:g} s unused; "
             f"{resident.IDLE_ENVIRONMENT}=0: none)" if idle else
             " (madtrace daemon --resident makes attaching faster)")
    code = start(pid, recording_options(args, args.output),
                 how=f"; {why}: started here{later}")
    if idle:
        resident.start_on_demand(idle)
    return code


def _resident(start_it: bool, quiet: bool, idle: float) -> int:
    from ..daemon import resident
    if start_it:
        from .main import build_parser, main
        result = resident.start_resident(resident.CommandLine(
            main=main, daemon_options=lambda argv: build_parser("daemon").parse_args(argv)),
            idle=idle)
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
