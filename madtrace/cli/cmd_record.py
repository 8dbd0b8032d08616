# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace record -o DIR [-f PATTERN]... [--data] [--force] [--repl [--batch FILE]] -- CMD ARGS..."""

from __future__ import annotations

import os
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
    parser.add_argument("--every", type=float, metavar="PERIOD",
                        help="with --for: record a window of --for seconds every PERIOD seconds of "
                             "a long run, the program untraced in between (the first window in "
                             "DIR, the next ones in DIR/window.2, DIR/window.3...)")
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
    if args.every is not None:
        return _windows(args, options, output)
    recording = Recording(options)
    child = None
    if args.start_after is not None:
        child = _start_untraced(args.target_command, args.start_after, args.start_at)
        if child.returncode is None and not _attach_unless_ended(recording, child):
            child.wait()
        if child.returncode is not None:
            recording.log(f"the program ended before --start-after {args.start_after:g} s "
                          f"(status {child.returncode}): nothing recorded")
            return recording, child.returncode
        recording.log(f"attached to process {child.pid} after {args.start_after:g} s")
    else:
        recording.launch(args.target_command)
    if args.repl:
        from ..live.host import run_with_frontend
        status = run_with_frontend(recording, args.batch)
    else:
        status = recording.run()
    if recording.flight is not None:
        taken = recording.flight.recorder.taken
        recording.log(f"flight recorder: {len(taken)} snapshot{'s' * (len(taken) != 1)} in "
                      f"{output}" + (f" (the last: {taken[-1]['directory']})" if taken else ""))
    else:
        recording.log(f"trace written to {output}")
    never = recording.meta.get("unmatched_functions")
    if never:
        raise UnknownSymbolError(f"no function matches {', '.join(map(repr, never))} in any image "
                                 f"or library of the target (trace written to {output})")
    return recording, status


def _windows(args, options, output: str) -> tuple[Recording, int | None]:
    """--every PERIOD --for SECONDS: the program started untraced; a window of
    SECONDS recorded at --start-after (default: at once), then every PERIOD, until
    the program ends.  Each window is a whole trace directory; DIR's meta.json
    lists the others (``windows``)."""
    import dataclasses
    import subprocess
    import time

    from ..recording.recording import Recording
    from ..trace.meta import read_meta, write_meta
    if args.duration is None:
        raise UsageError("--every needs --for SECONDS: the length of each window")
    if args.every <= args.duration:
        raise UsageError("--every must be longer than --for (the program runs untraced between "
                         "two windows)")
    if args.repl:
        raise UsageError("--every and --repl contradict each other")
    child = _start_untraced(args.target_command, args.start_after or 0.0, args.start_at, at_once=True)
    begin = time.monotonic()
    first: Recording | None = None
    windows: list[dict] = []
    status = child.returncode
    number = 0
    while status is None:
        number += 1
        where = output if number == 1 else os.path.join(output, f"window.{number}")
        recording = Recording(dataclasses.replace(options, output=where))
        if not _attach_unless_ended(recording, child):
            status = child.wait()
            break
        first = first or recording
        started = time.time()
        status = recording.run()
        recording.log(f"window {number} written to {where}")
        windows.append({"directory": os.path.relpath(where, output), "start_time": started,
                        "outcome": recording.meta.get("outcome")})
        if status is not None:
            break
        try:
            status = child.wait(timeout=max(begin + number * args.every - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:
            break
    if first is None:
        raise UsageError(f"{args.target_command[0]} ended before the first window "
                         f"(status {status}): nothing recorded")
    meta = read_meta(output)
    meta["windows"] = windows
    write_meta(output, meta)
    return first, status


def _attach_unless_ended(recording, child) -> bool:
    """``recording`` attached to the untraced ``child``; False if the child ended
    first (between its last look and the attach: a zombie then)."""
    from ..errors import NoSuchProcessError
    try:
        recording.attach(child.pid)
    except NoSuchProcessError:
        if child.poll() is None and not _is_zombie(child.pid):
            raise
        return False
    return True


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def _start_untraced(argv: list[str], seconds: float, start_at: str, at_once: bool = False):
    """The program started as a child of madtrace, untraced, and left to run
    ``seconds`` (or until it ends); ``at_once``: 0 s is allowed."""
    import subprocess

    from ..process.tracee import resolve_command
    if seconds < 0 or (seconds == 0 and not at_once):
        raise UsageError("--start-after must be a positive number of seconds")
    if start_at != "entry":
        raise UsageError("--start-after and --start-at main contradict each other")
    path = resolve_command(argv[0])       # launch's own checks and messages
    try:
        child = subprocess.Popen([path, *argv[1:]])
    except OSError as exc:
        raise CommandNotFoundError(f"{argv[0]}: {exc.strerror}") from None
    if seconds:
        try:
            child.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass
    return child


def run(args) -> int:
    _, status = record(args, args.output)
    return 0 if status is None else status
