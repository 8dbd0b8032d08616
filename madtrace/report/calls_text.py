# SPDX-License-Identifier: GPL-2.0-or-later
"""Text output of ``report --kind calls``: the per-function table and the
calling-context tree (and ``report_dict``, its JSON form)."""

from __future__ import annotations

from ..analysis.calltree import CallAnalysis, thread_dict

DEFAULT_TOP = 10      # human report: table rows and children per tree node
DEFAULT_DEPTH = 8     # human report: tree levels below the root


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
    clock = f"yes ({(analysis.tsc_hz or 0) / 1e9:.2f} GHz TSC)" if analysis.timed else "no"
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
