"""madtrace report DIR [--kind calls|segments] [--json] [--top N] [--depth D]"""

from __future__ import annotations

import json
import sys

from ..analysis.calltree import CallAnalysis, analyze_calls, thread_dict
from ..analysis.segments import segments
from ..errors import UsageError

NAME = "report"
HELP = ("analyse a trace directory: per-function call counts and times, and the call tree "
        "(one JSON object with --json); --kind segments: each call with its data accesses")
KINDS = ("calls", "segments")
DEFAULT_TOP = 10      # human report: table rows and children per tree node
DEFAULT_DEPTH = 8     # human report: tree levels below the root


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="trace directory written by madtrace record/attach")
    parser.add_argument("--kind", choices=KINDS, default="calls",
                        help="what to report (default: calls)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (whole tree unless --top/--depth are given)")
    parser.add_argument("--top", type=int, metavar="N", default=None,
                        help=f"functions listed and children shown per tree node "
                             f"(default {DEFAULT_TOP}; with --json: all)")
    parser.add_argument("--depth", type=int, metavar="D", default=None,
                        help=f"tree levels shown below the root (default {DEFAULT_DEPTH}; "
                             "with --json: all)")


# ------------------------------------------------------------------- JSON
def write_json(value, write) -> None:
    """json.dump without recursion: call trees can be thousands of levels deep."""
    pending: list[tuple[bool, object]] = [(False, value)]
    while pending:
        raw, item = pending.pop()
        if raw:
            write(item)
        elif isinstance(item, dict):
            write("{")
            pending.append((True, "}"))
            entries = list(item.items())
            for i in range(len(entries) - 1, -1, -1):
                key, v = entries[i]
                pending.append((False, v))
                pending.append((True, (", " if i else "") + json.dumps(str(key)) + ": "))
        elif isinstance(item, (list, tuple)):
            write("[")
            pending.append((True, "]"))
            for i in range(len(item) - 1, -1, -1):
                pending.append((False, item[i]))
                if i:
                    pending.append((True, ", "))
        else:
            write(json.dumps(item))


def report_dict(analysis: CallAnalysis, top: int | None, depth: int | None) -> dict:
    return {
        "kind": "calls",
        "directory": analysis.directory,
        "timestamps": analysis.timestamps,
        "tsc_hz": analysis.tsc_hz,
        "functions": analysis.functions,
        "tree": analysis.tree_dict(max_depth=depth, max_children=top),
        "counters": analysis.counters,
        "threads": {str(tid): thread_dict(analysis, t) for tid, t in analysis.threads.items()},
    }


# ------------------------------------------------------------------ human
def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _sorted_functions(analysis: CallAnalysis) -> list[tuple[str, dict]]:
    items = list(analysis.functions.items())
    if analysis.timed:
        items.sort(key=lambda kv: (-(kv[1]["incl_ns"] or 0), -kv[1]["calls"], kv[0]))
    else:
        items.sort(key=lambda kv: (-kv[1]["calls"], kv[0]))
    return items


def print_functions(analysis: CallAnalysis, top: int, out) -> None:
    items = _sorted_functions(analysis)
    timed = analysis.timed
    total = analysis.counters["span_ns"] if timed else analysis.counters["entries"]
    width = max([len("function")] + [len(name) for name, _ in items[:top]])
    share = "% time" if timed else "% calls"
    print(f"   {'function':<{width}} {'calls':>10} {'completed':>10} {'unwound':>8} {'open':>5} "
          f"{'incl ms':>11} {'excl ms':>11} {share:>7}", file=out)
    for name, f in items[:top]:
        part = f["incl_ns"] if timed else f["calls"]
        percent = f"{100.0 * part / total:.1f}" if total and part is not None else "-"
        print(f"   {name:<{width}} {f['calls']:>10} {f['completed']:>10} {f['unwound']:>8} "
              f"{f['open']:>5} {_ms(f['incl_ns']):>11} {_ms(f['excl_ns']):>11} {percent:>7}",
              file=out)
    if len(items) > top:
        rest = items[top:]
        print(f"   … {len(rest)} more functions ({sum(f['calls'] for _, f in rest)} calls)",
              file=out)


def _tree_line(node: dict, timed: bool) -> str:
    text = f"{node['name']}  calls={node['calls']}"
    if timed:
        text += f"  incl={_ms(node['incl_ns'])} ms  excl={_ms(node['excl_ns'])} ms"
    if node["unwound"]:
        text += f"  unwound={node['unwound']}"
    if node["open"]:
        text += f"  open={node['open']}"
    return text


def print_tree(analysis: CallAnalysis, top: int, depth: int, out) -> None:
    tree = analysis.tree_dict(max_depth=depth, max_children=top)
    timed = analysis.timed
    pending = [(child, 1) for child in reversed(tree["children"])]
    if "elided" in tree:
        pending.insert(0, ({"elided_of": tree}, 1))
    while pending:
        node, level = pending.pop()
        indent = "   " + "  " * level
        if "elided_of" in node:
            elided = node["elided_of"]["elided"]
            print(f"{indent}… {elided['children']} more ({elided['calls']} calls)", file=out)
            continue
        print(indent + _tree_line(node, timed), file=out)
        if "elided" in node:
            pending.append(({"elided_of": node}, level + 1))
        pending.extend((child, level + 1) for child in reversed(node["children"]))


def print_human_report(analysis: CallAnalysis, top: int, depth: int, out) -> None:
    c = analysis.counters
    clock = f"yes ({analysis.tsc_hz / 1e9:.2f} GHz TSC)" if analysis.timed else "no"
    print(f"== madtrace report of {analysis.directory} (calls)", file=out)
    print(f"   threads {c['threads']}   records {c['records']}   timestamps {clock}", file=out)
    print(f"   calls {c['entries']}   completed {c['completed_frames']}   unwound (longjmp) "
          f"{c['unwound_frames']}   open at end {c['open_frames']}   unmatched exits "
          f"{c['unmatched_exits']}", file=out)
    if c["tree_truncated"]:
        print(f"   the call tree was capped at {c['max_tree_nodes']} nodes: "
              f"{c['truncated_calls']} calls are under [truncated]", file=out)
    print("", file=out)
    print_functions(analysis, top, out)
    print("", file=out)
    print(f"   call tree (depth <= {depth}, top {top} children per node):", file=out)
    print_tree(analysis, top, depth, out)


def run(args) -> int:
    if args.kind == "segments":
        if args.json:
            raise UsageError("--kind segments has no --json form yet: use `madtrace summary --json`")
        for line in segments(args.directory, max_accesses=args.top or 8,
                             max_lines=400 if args.depth is None else max(args.depth, 1) * 50):
            print(line)
        return 0
    for option in ("top", "depth"):
        value = getattr(args, option)
        if value is not None and value < (0 if option == "depth" else 1):
            raise UsageError(f"--{option} must be {'>= 0' if option == 'depth' else '>= 1'}")
    analysis = analyze_calls(args.directory)
    if args.json:
        write_json(report_dict(analysis, args.top, args.depth), sys.stdout.write)
        sys.stdout.write("\n")
    else:
        top = DEFAULT_TOP if args.top is None else args.top
        depth = DEFAULT_DEPTH if args.depth is None else args.depth
        print_human_report(analysis, top, depth, sys.stdout)
    return 0
