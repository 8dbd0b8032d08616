# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace record -o DIR [-f PATTERN]... [--data] [--force] [--repl [--batch FILE]] -- CMD ARGS..."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import CommandNotFoundError, UnknownSymbolError, UsageError
from .options import add_recording_arguments, recording_options

if TYPE_CHECKING:       # the tracer is imported when the command runs (offline commands need none of it)
    from ..recording.recording import Recording

NAME = "record"
HELP = "launch CMD under madtrace and write a trace directory; exits with CMD's status"


def add_arguments(parser) -> None:
    add_recording_arguments(parser, default_output="madtrace.data")
    parser.add_argument("--start-at", choices=("entry", "main"), default="entry",
                        help="where tracing starts: the program's entry point or main()")
    parser.add_argument("--start-after", type=float, metavar="SECONDS",
                        help="run the program untraced for SECONDS, then attach to it and record "
                             "(as madtrace attach does: its start-up is not traced)")
    parser.add_argument("--for", "--duration", dest="duration", type=float, metavar="SECONDS",
                        help="stop recording after SECONDS: madtrace detaches and the program "
                             "runs on untraced")
    parser.add_argument("--repl", action="store_true",
                        help="control the program interactively while it runs (see madtrace repl)")
    parser.add_argument("--batch", metavar="FILE",
                        help="with --repl: run the commands of FILE (the program keeps its stdin), "
                        "then detach")


def record(args, output: str) -> tuple[Recording, int | None]:
    if not args.target_command:
        raise UsageError("no command given: madtrace record [options] -- CMD ARGS...")
    if args.batch is not None and not args.repl:
        raise UsageError("--batch goes with --repl")
    options = recording_options(args, output)
    if args.repl:
        from ..live.host import repl_options
        options = repl_options(options)
    from ..recording.recording import Recording
    recording = Recording(options)
    child = None
    if args.start_after is not None:
        child = _start_untraced(args.target_command, args.start_after, args.start_at)
        if child.returncode is not None:
            recording.log(f"the program ended before --start-after {args.start_after:g} s "
                          f"(status {child.returncode}): nothing recorded")
            return recording, child.returncode
        recording.attach(child.pid)
        recording.log(f"attached to process {child.pid} after {args.start_after:g} s")
    else:
        recording.launch(args.target_command)
    if args.repl:
        from ..live.host import run_with_frontend
        status = run_with_frontend(recording, args.batch)
    else:
        status = recording.run()
    recording.log(f"trace written to {output}")
    never = recording.meta.get("unmatched_functions")
    if never:
        raise UnknownSymbolError(f"no function matches {', '.join(map(repr, never))} in any image "
                                 f"or library of the target (trace written to {output})")
    return recording, status


def _start_untraced(argv: list[str], seconds: float, start_at: str):
    """The program started as a child of madtrace, untraced, and left to run
    ``seconds`` (or until it ends)."""
    import shutil
    import subprocess
    if seconds <= 0:
        raise UsageError("--start-after must be a positive number of seconds")
    if start_at != "entry":
        raise UsageError("--start-after and --start-at main contradict each other")
    if shutil.which(argv[0]) is None:
        raise CommandNotFoundError(f"{argv[0]}: no such program (or not executable)")
    try:
        child = subprocess.Popen(argv)
    except OSError as exc:
        raise CommandNotFoundError(f"{argv[0]}: {exc.strerror}") from None
    try:
        child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass
    return child


def run(args) -> int:
    _, status = record(args, args.output)
    return 0 if status is None else status
