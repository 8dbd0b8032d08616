"""Options shared by the commands that record (record, run, attach)."""

from __future__ import annotations

import argparse
import re
import os
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:       # the tracer is imported by the commands that record, when they run
    from ..recording.recording import RecordOptions


DEFAULT_DATA_ENGINE = "hybrid"


def parse_pid(text: str) -> int:
    """A process id as given on the command line: a positive decimal integer."""
    try:
        pid = int(text, 10)
    except (TypeError, ValueError):
        pid = 0
    if pid <= 0:
        raise UsageError(f"not a PID: {text!r}")
    return pid


def add_recording_arguments(parser: argparse.ArgumentParser, default_output: str | None) -> None:
    parser.add_argument("-o", "--output", default=default_output, metavar="DIR",
                        help="trace directory to write (default: " + (
                            default_output or "madtrace.data, or madtrace.data.N (the first N "
                            "that is free)") + ")")
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
    parser.add_argument("--regions", action="append", default=[], metavar="GLOB",
                        help="with --data: trace only the regions whose label matches (repeatable; "
                        "labels as in the summary: '.data of prog', '.bss of libc.so.6', '[heap]', "
                        "'[anon*' for mappings the program creates; '.rodata of prog', constant "
                        "data, is traced only when a glob names it)")
    parser.add_argument("--only", action="append", default=[], metavar="VAR|BLOCK",
                        help="with --data: trace only this global variable, or only the heap "
                        "block with this number (malloc0014, 14) (repeatable)")
    parser.add_argument("--data-in", action="append", default=[], metavar="FUNC",
                        help="with --data: record only while a thread is inside a function "
                        "matching this glob (nested calls included; repeatable)")
    kinds = parser.add_mutually_exclusive_group()
    kinds.add_argument("--loads-only", action="store_true", help="with --data: record loads only")
    kinds.add_argument("--stores-only", action="store_true", help="with --data: record stores only")
    parser.add_argument("--data-engine", choices=("hybrid", "fault"), default=None,
                        help="with --data: how accesses are recorded: hybrid (faults find the "
                        "instructions that touch traced data, rewritten code records them "
                        "inside the target; the default) or fault (a ptrace stop per access: "
                        "slower, no code rewritten, to compare with and the safe choice); "
                        "default: $MADTRACE_DATA_ENGINE, else hybrid")
    parser.add_argument("--copy-after", type=int, default=None, metavar="N",
                        help="with --data, hybrid engine: copy a function with probes once N "
                        "of its accesses faulted (default 1: at its first fault); until then "
                        "the fault path records them (code that stays cold is never copied: "
                        "cheaper where much code touches traced data only a few times)")
    parser.add_argument("--no-alloc", dest="track_allocations", action="store_false",
                        help="with --data: do not track malloc/calloc/realloc/free (no forged "
                        "block names; two ptrace stops fewer per allocator call)")
    parser.add_argument("--follow-forks", action="store_true",
                        help="trace fork/vfork children too (default: leave them untraced)")
    parser.add_argument("--store", action="store_true",
                        help="build the columnar store (DIR/store) as soon as the target ends "
                        "(default: when a query, export or report first needs it; the "
                        "summary needs none)")
    parser.add_argument("--no-store", dest="store", action="store_false",
                        help="the default: the store is built on first use")
    parser.add_argument("--max-size", metavar="SIZE",
                        help="stop recording once the trace holds SIZE bytes (100M, 2G): madtrace "
                             "detaches and the program runs on untraced; meta.json says so")
    flight = parser.add_argument_group("flight recorder (nothing written until a trigger)")
    flight.add_argument("--flight", metavar="SIZE",
                        help="keep only the last SIZE of the recording (100M, 1G), in memory; "
                             "write it to DIR/snapshot.N on a trigger (--trigger-on, "
                             "--trigger-slow, a signal that kills the program, SIGUSR1 to "
                             "madtrace, 'madtrace ctl PID snapshot'), or at the end if none "
                             "fired")
    flight.add_argument("--keep", type=float, metavar="SECONDS",
                        help="flight recorder: keep only the last SECONDS (with or without "
                             "--flight SIZE)")
    flight.add_argument("--trigger-on", action="append", default=[], metavar="FUNC[:N]",
                        help="flight recorder: a snapshot when FUNC is called (every Nth call); "
                             "FUNC must be traced (-f)")
    flight.add_argument("--trigger-slow", action="append", default=[], metavar="FUNC:TIME",
                        help="flight recorder: a snapshot when a call of FUNC takes longer than "
                             "TIME (5ms, 200us, 1s): the slow request")
    flight.add_argument("--snapshots", type=int, metavar="N",
                        help="flight recorder: keep the last N snapshots (default: all)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages")


SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, option: str) -> int:
    """``100M`` -> bytes (K, M, G, T: powers of 1024; an optional B)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"{option}: {text!r} is not a size (100M, 2G, 65536)")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2)])


def recording_options(args, output: str) -> RecordOptions:
    duration = getattr(args, "duration", None)
    if duration is not None and duration <= 0:
        raise UsageError("--for (--duration) must be a positive number of seconds")
    max_size = getattr(args, "max_size", None)
    max_bytes = parse_size(max_size, "--max-size") if max_size is not None else None
    selecting = args.regions or args.only or args.data_in or args.loads_only or args.stores_only \
        or args.data_engine or args.copy_after is not None
    if selecting and not args.data:
        raise UsageError("--regions, --only, --data-in, --loads-only, --stores-only, "
                         "--data-engine and --copy-after concern data accesses: add --data")
    if args.copy_after is not None and args.copy_after < 1:
        raise UsageError("--copy-after must be at least 1")
    flight_size = getattr(args, "flight", None)
    flight_bytes = parse_size(flight_size, "--flight") if flight_size is not None else None
    keep = getattr(args, "keep", None)
    if keep is not None and keep <= 0:
        raise UsageError("--keep must be a positive number of seconds")
    snapshots = getattr(args, "snapshots", None)
    if snapshots is not None and snapshots < 1:
        raise UsageError("--snapshots must be at least 1")
    from ..flight.triggers import parse_on, parse_slow
    triggers = [parse_on(t) for t in getattr(args, "trigger_on", [])] + \
        [parse_slow(t) for t in getattr(args, "trigger_slow", [])]
    from ..recording.recording import RecordOptions
    return RecordOptions(output=output, force=args.force, functions=args.functions,
                         data=args.data, follow_forks=args.follow_forks,
                         data_regions=args.regions, data_only=args.only, data_in=args.data_in,
                         loads=not args.stores_only, stores=not args.loads_only,
                         start_at=getattr(args, "start_at", "entry"), duration=duration,
                         quiet=args.quiet, trace_functions=args.trace_functions,
                         timestamps=args.timestamps, method=args.method,
                         track_allocations=args.track_allocations, store=args.store,
                         data_engine=data_engine(args.data_engine),
                         copy_after=args.copy_after, max_bytes=max_bytes,
                         flight_bytes=flight_bytes, keep_seconds=keep, triggers=triggers,
                         snapshots=snapshots)


def data_engine(chosen: str | None) -> str:
    engine = chosen or os.environ.get("MADTRACE_DATA_ENGINE") or DEFAULT_DATA_ENGINE
    if engine not in ("hybrid", "fault"):
        raise UsageError(f"MADTRACE_DATA_ENGINE must be 'hybrid' or 'fault', not {engine!r}")
    return engine
