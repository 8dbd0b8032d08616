# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace diff A B [--json] [--top N] [--cache [SPEC]]

Two trace directories of the same program compared, the largest changes
first: per function (calls, inclusive and exclusive time, accesses), per data
(variables, heap allocation sites, the rest per region: accesses, bytes), per
allocation site (blocks, bytes allocated, accesses) and, with --cache, the
misses of the cache simulation per level and per data (analysis/diff.py).
Reads the raw traces as the summary does: no store is built.
"""

from __future__ import annotations

import argparse
import sys

from ..analysis.diff import check_comparable, diff_traces, trace_info
from ..errors import NoDataError, UsageError
from ..report.diff_text import print_diff
from ..report.json_out import write_json

NAME = "diff"
HELP = (
    "compare two trace directories of the same program: calls, time, accesses per "
    "function; accesses per data; heap allocation sites; with --cache, cache misses"
)
DEFAULT_TOP = 20


def add_arguments(parser) -> None:
    parser.add_argument("a", metavar="A", help="trace directory (the reference)")
    parser.add_argument("b", metavar="B", help="trace directory compared with A")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (every row of every table)"
    )
    parser.add_argument(
        "--top",
        type=int,
        metavar="N",
        default=DEFAULT_TOP,
        help=f"rows per table (default {DEFAULT_TOP}; with --json: all)",
    )
    parser.add_argument(
        "--cache",
        nargs="?",
        const="",
        default=None,
        metavar="SPEC",
        help="also compare the simulated cache misses per level and per data "
        "(needs --data traces; SPEC as report --kind cache takes it, e.g. "
        "L1=32K:8:64,L2=1M:16:64; default: this machine's caches; give it after A B)",
    )


def cache_of(args, directory: str) -> dict:
    """The cache kind's JSON of one trace, simulated as ``--cache`` says."""
    from ..kinds import KINDS

    kind = KINDS["cache"]
    if kind.json is None:
        raise UsageError("--cache: the cache report has no JSON form")
    options = argparse.Namespace(**vars(args))
    options.directory = directory
    options.cache = args.cache or None  # None: the machine's caches
    return kind.json(kind.compute(directory, options), options)


def run(args) -> int:
    if args.top < 1:
        raise UsageError("--top must be >= 1")
    a, b = trace_info(args.a), trace_info(args.b)
    check_comparable(a, b)
    cache = None
    if args.cache is not None:
        from ..kinds import KINDS

        if "cache" not in KINDS:
            raise UsageError("--cache: this madtrace has no cache simulation (report --kind cache)")
        if not (a.has_accesses and b.has_accesses):
            raise NoDataError("--cache needs data accesses: record both traces with --data")
        cache = (cache_of(args, args.a), cache_of(args, args.b))
    diff = diff_traces(a, b, cache)
    if args.json:
        write_json(diff, sys.stdout.write)
        sys.stdout.write("\n")
    else:
        print_diff(diff, args.top, sys.stdout)
    return 0
