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

from ..errors import NoDataError, OutputError, OutputExistsError, UsageError
from ..kinds import KINDS, Kind, available, compute, html_sections
from ..report.calls_text import DEFAULT_DEPTH, DEFAULT_TOP
from ..report.json_out import write_json
from ..trace.meta import read_meta

NAME = "report"
HELP = ("analyse a trace directory: "
        + ", ".join(f"{k.name} ({k.help})" for k in KINDS.values())
        + ", all; as text, --json, --png FILE or --html FILE")
PNG_KINDS = tuple(k.name for k in KINDS.values() if k.png is not None)
DEFAULT_DATA_TOP = 20


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="trace directory written by madtrace record/attach")
    parser.add_argument("--kind", choices=tuple(KINDS) + ("all",), default=None,
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
    parser.add_argument("--cache", metavar="SPEC",
                        help="cache: the hierarchy to simulate, LEVEL=SIZE:WAYS:LINE,... e.g. "
                             "L1=32K:8:64,L2=1M:16:64,L3=32M:16:64 (default: this machine's, "
                             "as /sys/devices/system/cpu/cpu0/cache says)")
    parser.add_argument("--line", type=int, metavar="N", default=None,
                        help="sharing, reuse: the cache line in bytes (default 64)")
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
    kinds = [k.name for k in available(directory)]
    if not kinds:
        raise NoDataError(f"{directory} has neither call records nor data accesses to report on")
    return kinds


# ----------------------------------------------------------------- analyses
class Results:
    """Each analysis computed once, whatever the outputs asked for."""

    def __init__(self, args):
        self.args = args
        self.cache: dict[str, object] = {}

    def compute(self, kinds: list[str]) -> None:
        """The analyses of ``kinds``, in order: those that share a pass over the
        accesses in one (kinds.compute)."""
        todo = [KINDS[k] for k in dict.fromkeys(kinds) if k not in self.cache]
        self.cache.update(compute(todo, self.args.directory, self.args))

    def get(self, kind: str):
        if kind not in self.cache:
            self.compute([kind])
        return self.cache[kind]

    def as_dict(self, kind: str) -> dict:
        json_of = KINDS[kind].json
        assert json_of is not None      # kinds without JSON are text listings, refused before
        return json_of(self.get(kind), self.args)


def print_text(results: Results, kind: str, out) -> None:
    args, spec = results.args, KINDS[kind]
    top = args.top if args.top is not None else spec.default_top
    spec.text(results.get(kind), top, args, out)


def write_png(results: Results, kind: str, path: str) -> None:
    draw = KINDS[kind].png
    if draw is None:
        raise UsageError(f"--png draws {', '.join(PNG_KINDS)}; --kind {kind} has no picture")
    draw(results.get(kind), path)


# ---------------------------------------------------------------------- run
def _listing(args, spec: Kind) -> int:
    if args.json or args.png or args.html:
        raise UsageError(spec.text_only)
    spec.text(spec.compute(args.directory, args), args.top or 0, args, sys.stdout)
    return 0


def run(args) -> int:
    for option in ("top", "depth"):
        value = getattr(args, option)
        if value is not None and value < (0 if option == "depth" else 1):
            raise UsageError(f"--{option} must be {'>= 0' if option == 'depth' else '>= 1'}")
    kind = _kind_of(args)
    if args.topology and kind not in ("numa", "all"):
        raise UsageError("--topology is for --kind numa")
    if args.cache is not None and kind != "cache":
        raise UsageError("--cache is for --kind cache")
    if args.line is not None and kind not in ("sharing", "reuse"):
        raise UsageError("--line is for --kind sharing and --kind reuse")
    if kind != "all" and KINDS[kind].text_only:
        return _listing(args, KINDS[kind])
    if args.png and kind not in PNG_KINDS:
        raise UsageError(f"--png draws {', '.join(PNG_KINDS)}; --kind {kind} has no picture")
    _check_output(args.png, args.force)
    _check_output(args.html, args.force)
    if args.png and args.html and os.path.abspath(args.png) == os.path.abspath(args.html):
        raise UsageError("--png and --html name the same file")
    kinds = available_kinds(args.directory) if kind == "all" else [kind]
    shown = html_sections([KINDS[name] for name in kinds]) if args.html else []
    results = Results(args)
    results.compute(kinds + [k.name for k in shown])    # every error before any output
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
        sections = [(k.name, k.html(results.get(k.name)))  # type: ignore[misc]  # html_sections: has one
                    for k in shown]
        write_html(args.directory, sections, args.html, {k.name: results.get(k.name) for k in shown})
        print(f"madtrace: wrote {args.html}", file=sys.stderr)
    return 0
