# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace report DIR [--kind KIND] [--json] [--png FILE] [--html FILE] [--force]
[--top N] [--depth D] [--topology FILE]

Kinds: calls (per-function table and call tree), segments (each call with
its accesses), heatmap, alloc, numa, footprint, source (accesses per source
line), all (every kind the trace has the data for).  Text on stdout by
default; --json prints one JSON object instead; --png FILE and --html FILE
write a picture / a self-contained page (never over an existing file
without --force).
"""

from __future__ import annotations

import os
import sys

from ..analysis.calltree import analyze_calls
from ..analysis.segments import segments
from ..errors import NoDataError, OutputError, OutputExistsError, UsageError
from ..report import text
from ..report.calls_text import DEFAULT_DEPTH, DEFAULT_TOP, print_human_report, report_dict
from ..report.json_out import write_json
from ..trace.compact import access_files
from ..trace.store import read_meta

NAME = "report"
HELP = ("analyse a trace directory: calls (per-function counts and times, call tree), "
        "segments (each call with its accesses), heatmap (accesses per page), alloc (heap "
        "blocks and allocation sites), numa (local/remote/unpinned accesses), footprint "
        "(distinct bytes/lines/pages per call and function), source (accesses per source "
        "line), all; as text, --json, --png FILE or --html FILE")
DATA_KINDS = ("heatmap", "alloc", "numa", "footprint", "source")
KINDS = ("calls", "segments") + DATA_KINDS + ("all",)
PNG_KINDS = ("heatmap", "alloc", "footprint")
DEFAULT_DATA_TOP = 20


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="trace directory written by madtrace record/attach")
    parser.add_argument("--kind", choices=KINDS, default=None,
                        help="what to report (default: calls; heatmap with --png; all with --html)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--png", metavar="FILE", help=f"write a PNG picture ({', '.join(PNG_KINDS)})")
    parser.add_argument("--html", metavar="FILE",
                        help="write one self-contained HTML page: annotated sources and the tables")
    parser.add_argument("--force", action="store_true", help="overwrite --png/--html files")
    parser.add_argument("--top", type=int, metavar="N", default=None,
                        help=f"rows per table (default {DEFAULT_TOP} for calls, "
                             f"{DEFAULT_DATA_TOP} for the others; with --json: all)")
    parser.add_argument("--depth", type=int, metavar="D", default=None,
                        help=f"call tree levels shown below the root (default {DEFAULT_DEPTH}; "
                             "with --json: all)")
    parser.add_argument("--topology", metavar="FILE",
                        help="numa: a simulated topology (JSON: nodes -> CPUs, page ranges -> "
                             "node, policy) instead of the recorded one")


# ---------------------------------------------------------------- arguments
def _check_output(path: str | None, force: bool) -> None:
    if path is None:
        return
    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory")
    if os.path.lexists(path) and not force:
        raise OutputExistsError(f"{path} already exists (use --force to overwrite it)")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"cannot write {path}: no such directory {parent}")


def _kind_of(args) -> str:
    if args.kind is not None:
        return args.kind
    if args.html and not args.png:
        return "all"
    return "heatmap" if args.png else "calls"


def available_kinds(directory: str) -> list[str]:
    """The kinds ``all`` covers: those whose input the trace has."""
    read_meta(directory)
    calls = os.path.exists(os.path.join(directory, "functions.json"))
    data = bool(access_files(directory))
    kinds = ["calls"] if calls else []
    if data:
        kinds += ["heatmap", "alloc", "source"]
        if os.path.exists(os.path.join(directory, "data", "numa.json")):
            kinds.append("numa")
        if calls:
            kinds.append("footprint")
    if not kinds:
        raise NoDataError(f"{directory} has neither call records nor data accesses to report on")
    return kinds


# ----------------------------------------------------------------- analyses
class Results:
    """Each analysis computed once, whatever the outputs asked for."""

    def __init__(self, args):
        self.args = args
        self.cache: dict[str, object] = {}

    def get(self, kind: str):
        if kind not in self.cache:
            self.cache[kind] = self._compute(kind)
        return self.cache[kind]

    def _compute(self, kind: str):
        directory = self.args.directory
        if kind == "calls":
            return analyze_calls(directory)
        if kind == "heatmap":
            from ..analysis.heatmap import heatmap
            return heatmap(directory)
        if kind == "alloc":
            from ..analysis.alloc_usage import alloc_usage
            return alloc_usage(directory)
        if kind == "numa":
            from ..analysis.numa import load_topology, numa_report
            topology = load_topology(self.args.topology) if self.args.topology else None
            return numa_report(directory, topology)
        if kind == "source":
            from ..analysis.source_lines import source_lines
            return source_lines(directory)
        if kind == "footprint":
            from ..analysis.footprint import DEFAULT_TOP_CALLS, footprint
            return footprint(directory, top=max(self.args.top or 0, DEFAULT_TOP_CALLS))
        raise UsageError(f"unknown kind {kind}")

    def as_dict(self, kind: str) -> dict:
        result = self.get(kind)
        if kind == "calls":
            return report_dict(result, self.args.top, self.args.depth)
        return result.to_dict()


def print_text(results: Results, kind: str, out) -> None:
    args = results.args
    top = args.top if args.top is not None else (DEFAULT_TOP if kind == "calls" else DEFAULT_DATA_TOP)
    result = results.get(kind)
    if kind == "calls":
        print_human_report(result, top, DEFAULT_DEPTH if args.depth is None else args.depth, out)
    elif kind == "heatmap":
        text.print_heatmap(result, out)
    elif kind == "alloc":
        text.print_alloc(result, top, out)
    elif kind == "numa":
        text.print_numa(result, top, out)
    elif kind == "source":
        text.print_source(result, top, out)
    elif kind == "footprint":
        text.print_footprint(result, top, out)


def write_png(results: Results, kind: str, path: str) -> None:
    from ..report import png
    if kind == "heatmap":
        png.write_heatmap_png(results.get(kind), path)
    elif kind == "alloc":
        png.write_alloc_png(results.get(kind), path)
    elif kind == "footprint":
        png.write_footprint_png(results.get(kind), path)
    else:
        raise UsageError(f"--png draws {', '.join(PNG_KINDS)}; --kind {kind} has no picture")


# ---------------------------------------------------------------------- run
def _segments(args) -> int:
    if args.json or args.png or args.html:
        raise UsageError("--kind segments is a text listing (its data: madtrace export, "
                         "madtrace query)")
    for line in segments(args.directory, max_accesses=args.top or 8,
                         max_lines=400 if args.depth is None else max(args.depth, 1) * 50):
        print(line)
    return 0


def run(args) -> int:
    for option in ("top", "depth"):
        value = getattr(args, option)
        if value is not None and value < (0 if option == "depth" else 1):
            raise UsageError(f"--{option} must be {'>= 0' if option == 'depth' else '>= 1'}")
    kind = _kind_of(args)
    if args.topology and kind not in ("numa", "all"):
        raise UsageError("--topology is for --kind numa")
    if kind == "segments":
        return _segments(args)
    if args.png and kind not in PNG_KINDS:
        raise UsageError(f"--png draws {', '.join(PNG_KINDS)}; --kind {kind} has no picture")
    _check_output(args.png, args.force)
    _check_output(args.html, args.force)
    if args.png and args.html and os.path.abspath(args.png) == os.path.abspath(args.html):
        raise UsageError("--png and --html name the same file")
    kinds = available_kinds(args.directory) if kind == "all" else [kind]
    results = Results(args)
    for k in kinds:
        results.get(k)                 # every error before any output
    if args.json:
        value = results.as_dict(kind) if kind != "all" else \
            {"kind": "all", "directory": args.directory,
             "reports": {k: results.as_dict(k) for k in kinds}}
        write_json(value, sys.stdout.write)
        sys.stdout.write("\n")
    elif not args.png and not args.html:
        for i, k in enumerate(kinds):
            if i:
                print()
            print_text(results, k, sys.stdout)
    if args.png:
        write_png(results, kind, args.png)
        print(f"madtrace: wrote {args.png}", file=sys.stderr)
    if args.html:
        from ..report.html import write_html
        write_html(results, kinds, args.html)
        print(f"madtrace: wrote {args.html}", file=sys.stderr)
    return 0
