"""madtrace export DIR --format madt|lackey|chrome|parquet [--raw] [--max-events N] [-o FILE]
[--force]"""

from __future__ import annotations

import os
import sys

from ..analysis.segments import address_space_of
from ..errors import CorruptTraceError, OutputExistsError, UsageError, writing
from ..trace import store
from ..trace.events import AllocEvent, load_allocations, ordered_events
from ..trace.madt import access_line, alloc_line

NAME = "export"
HELP = ("write a trace in another format: its data events as MadT's text (symbolic, or --raw) "
        "or valgrind lackey's --trace-mem format; its calls and accesses as a Chrome/Perfetto "
        "JSON timeline; its store as one Parquet file per table")
FORMATS = ("madt", "lackey", "chrome", "parquet")
DEFAULT_MAX_EVENTS = 1_000_000


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="trace directory written with --data")
    parser.add_argument("--format", choices=FORMATS, required=True)
    parser.add_argument("--raw", action="store_true", help="madt: numeric addresses (# lines)")
    parser.add_argument("--max-events", type=int, metavar="N", default=DEFAULT_MAX_EVENTS,
                        help=f"chrome: at most N events, the earliest (default {DEFAULT_MAX_EVENTS}; "
                        "a warning says when the trace was cut)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="output file (default: stdout); parquet: the directory to create")
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


def madt_lines(directory: str, raw: bool):
    space = address_space_of(directory)
    blocks = {b["id"]: b for b in load_allocations(directory)}
    threads: dict[int, int] = {}
    for _order, tid, event in ordered_events(directory):
        thread = threads.setdefault(tid, len(threads))
        if isinstance(event, AllocEvent):
            yield alloc_line(event.kind, thread, event.block, raw)
        else:
            kind = "L" if int(event["kind"]) == 1 else "S"
            yield access_line(kind, thread, event, space, blocks.get(int(event["block"])), raw)


def lackey_lines(directory: str):
    """lackey's --trace-mem format: "I  addr,len" for each execution of an
    instruction that accessed traced memory, then its " L addr,size" and
    " S addr,size" lines; a load and a store of the same bytes by one
    execution are one " M" line, as lackey writes them."""
    pending = None     # a load that may turn into an M
    for _order, _tid, event in ordered_events(directory):
        if isinstance(event, AllocEvent):
            continue
        address, size = int(event["addr"]), int(event["size"])
        kind = "L" if int(event["kind"]) == 1 else "S"
        if pending is not None:
            if kind == "S" and not event["first"] and pending == (address, size):
                yield f" M {address:08x},{size}"
                pending = None
                continue
            yield f" L {pending[0]:08x},{pending[1]}"
            pending = None
        if event["first"]:
            yield f"I  {int(event['rip']):08x},{int(event['ilen'])}"
        if kind == "L":
            pending = (address, size)
        else:
            yield f" S {address:08x},{size}"
    if pending is not None:
        yield f" L {pending[0]:08x},{pending[1]}"


def _check_output(path: str, force: bool) -> None:
    if os.path.lexists(path) and not force:
        raise OutputExistsError(f"{path} already exists (use --force to overwrite it)")


def export_chrome(args) -> int:
    from ..trace.chrome import write_chrome
    if args.max_events < 1:
        raise UsageError("--max-events must be >= 1")

    def warn(message: str) -> None:
        print(f"madtrace: export: {message}", file=sys.stderr, flush=True)

    if args.output:
        _check_output(args.output, args.force)
        with writing(args.output), open(args.output, "w") as out:
            write_chrome(args.directory, out, args.max_events, warn)
    else:
        write_chrome(args.directory, sys.stdout, args.max_events, warn)
    return 0


def export_parquet(args) -> int:
    from ..trace.query import copy_store
    if not args.output:
        raise UsageError("--format parquet writes a directory: give it with -o DIR")
    _check_output(args.output, args.force)
    with writing(args.output):
        copy_store(args.directory, args.output, sys.stderr)
    return 0


def run(args) -> int:
    store.read_meta(args.directory)   # a clear error for anything but a trace directory
    if args.format == "chrome":
        return export_chrome(args)
    if args.format == "parquet":
        return export_parquet(args)
    if not os.path.isdir(os.path.join(args.directory, "data")):
        raise CorruptTraceError(f"{args.directory}: no data accesses (recorded without --data)")
    lines = madt_lines(args.directory, args.raw) if args.format == "madt" \
        else lackey_lines(args.directory)
    if args.output:
        if os.path.exists(args.output) and not args.force:
            raise OutputExistsError(f"{args.output} already exists (use --force to overwrite it)")
        with writing(args.output), open(args.output, "w") as out:
            for line in lines:
                out.write(line + "\n")
    else:
        write = sys.stdout.write
        for line in lines:
            write(line + "\n")
    return 0
