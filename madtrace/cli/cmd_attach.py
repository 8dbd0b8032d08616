# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace attach PID -o DIR [-f PATTERN]... [--data] [--duration SECONDS]
[--repl [--batch FILE] | --daemon]"""

from __future__ import annotations

from ..errors import UsageError
from .options import add_recording_arguments, parse_pid, recording_options

NAME = "attach"
HELP = ("attach to a running process (every thread), trace it until it exits, "
        "--duration expires, or Ctrl-C/SIGTERM/SIGHUP, then detach leaving it running")


def add_arguments(parser) -> None:
    parser.add_argument("pid", help="process to attach to")
    add_recording_arguments(parser, default_output="madtrace.data")
    parser.add_argument("--duration", "--for", dest="duration", type=float, metavar="SECONDS",
                        help="detach after this many seconds")
    live = parser.add_mutually_exclusive_group()
    live.add_argument("--repl", action="store_true",
                      help="control the process interactively (see madtrace repl)")
    live.add_argument("--daemon", action="store_true",
                      help="trace in the background: return once attached (see madtrace daemon)")
    parser.add_argument("--batch", metavar="FILE",
                        help="with --repl: run the commands of FILE, then detach")


def run(args) -> int:
    pid = parse_pid(args.pid)
    if args.target_command:
        raise UsageError("attach takes a PID, not a command after --")
    if args.batch is not None and not args.repl:
        raise UsageError("--batch goes with --repl")
    options = recording_options(args, args.output)
    if args.daemon:
        from .cmd_daemon import start
        return start(pid, options)
    if args.repl:
        from ..live.host import repl_options
        options = repl_options(options)
    from ..recording.recording import Recording
    recording = Recording(options)
    recording.attach(pid)
    recording.log(f"attached to process {pid} ({recording.tracee.threads_seen} threads)")
    if args.repl:
        from ..live.host import run_with_frontend
        status = run_with_frontend(recording, args.batch)
    else:
        status = recording.run()
    recording.log(f"trace written to {args.output}")
    return 0 if status is None else status
