"""Options shared by the commands that record (record, run, attach)."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ..session import RecordOptions


def add_recording_arguments(parser: argparse.ArgumentParser, default_output: str | None) -> None:
    parser.add_argument("-o", "--output", default=default_output, metavar="DIR",
                        help="trace directory to write (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing trace directory")
    parser.add_argument("-f", "--function", dest="functions", action="append", default=[],
                        metavar="PATTERN", help="trace calls of functions matching this glob "
                        "(repeatable; 'libc.so.6:mem*' for library functions)")
    parser.add_argument("--no-functions", dest="trace_functions", action="store_false",
                        help="do not trace function calls (default: every function of the "
                        "main executable, or those given with -f)")
    parser.add_argument("--no-time", dest="timestamps", action="store_false",
                        help="no timestamps in call records (cheaper; order is still exact)")
    parser.add_argument("--method", choices=("auto", "callsite", "entry"), default="auto",
                        help="how functions are patched: auto picks the exact method per function "
                        "(call sites for local functions, entry for exported or address-taken "
                        "ones); callsite/entry force one (the patch report flags inexact ones)")
    parser.add_argument("--data", action="store_true", help="trace data memory accesses")
    parser.add_argument("--no-alloc", dest="track_allocations", action="store_false",
                        help="with --data: do not track malloc/calloc/realloc/free (no forged "
                        "block names; two ptrace stops fewer per allocator call)")
    parser.add_argument("--follow-forks", action="store_true",
                        help="trace fork/vfork children too (default: leave them untraced)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages")


def recording_options(args, output: str) -> RecordOptions:
    duration = getattr(args, "duration", None)
    if duration is not None and duration <= 0:
        raise UsageError("--duration must be a positive number of seconds")
    return RecordOptions(output=output, force=args.force, functions=args.functions,
                         data=args.data, follow_forks=args.follow_forks,
                         start_at=getattr(args, "start_at", "entry"), duration=duration,
                         quiet=args.quiet, trace_functions=args.trace_functions,
                         timestamps=args.timestamps, method=args.method,
                         track_allocations=args.track_allocations)
