# SPDX-License-Identifier: GPL-2.0-or-later
"""Text output of the data analyses (heatmap, alloc, numa, source,
footprint): compact tables for a terminal, ``top`` rows per table."""

from __future__ import annotations

import math
import os

from ..analysis.heatmap import COLUMNS, Heatmap
from ..trace.format import PAGE

RAMP = ".:-=+*#%@"      # log scale, 1 .. the largest cell


def table(headers: list[str], rows: list[list], out, indent: str = "   ",
          left: tuple[int, ...] = (0,)) -> None:
    """Columns sized to their content; columns in ``left`` left-aligned, the rest right."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values):
        return indent + "  ".join((f"{v:<{w}}" if i in left else f"{v:>{w}}")
                                  for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    print(line(headers), file=out)
    for row in cells:
        print(line(row), file=out)


def more_rows(rows: list, top: int, what: str, out) -> None:
    if len(rows) > top:
        print(f"   … {len(rows) - top} more {what} (raise --top, or --json for all)", file=out)


def shade(value: int, largest: int) -> str:
    if value <= 0:
        return " "
    if largest <= 1:
        return RAMP[-1]
    level = int(math.log(value) / math.log(largest) * (len(RAMP) - 1) + 0.5)
    return RAMP[min(level, len(RAMP) - 1)]


def _pages(n: int) -> str:
    return f"{n} page" + ("" if n == 1 else "s")


# ------------------------------------------------------------------ heatmap
def print_heatmap(heatmap: Heatmap, out) -> None:
    d = heatmap.to_dict()
    largest = heatmap.max_cell
    print(f"== madtrace heatmap of {heatmap.directory}", file=out)
    print(f"   {d['loads'] + d['stores']} accesses ({d['loads']} loads, {d['stores']} stores) and "
          f"{d['block_events']} block events on {d['touched_pages']} touched pages", file=out)
    print(f"   one character per page, {COLUMNS} per line, accesses + block events, log scale: "
          f"'{RAMP[0]}' 1 … '{RAMP[-1]}' {largest}, ' ' none; untraced regions have no cells",
          file=out)
    for r in heatmap.regions:
        t = r.totals()
        head = f"   {r.label}  {r.start:#x}-{r.end:#x}  {_pages(r.pages)}"
        if not r.traced:
            print(f"{head}  untraced", file=out)
            continue
        grouped = f"  ({r.cell_pages} pages per character)" if r.cell_pages > 1 else ""
        print(f"{head}  L {t['loads']}  S {t['stores']}  B {t['block_events']}  touched "
              f"{t['touched_pages']}{grouped}", file=out)
        values = r.cell_values().tolist()
        for row in range(0, len(values), COLUMNS):
            cells = "".join(shade(v, largest) for v in values[row:row + COLUMNS])
            print(f"      {r.first_page + row * r.cell_pages * PAGE:#014x} |{cells}|", file=out)


# -------------------------------------------------------------------- alloc
def print_alloc(usage, top: int, out) -> None:
    t = usage.totals
    print(f"== madtrace alloc of {usage.directory}: {t['blocks']} blocks ({t['bytes_allocated']} "
          f"bytes) at {len(usage.sites)} sites; {t['loads']} loads, {t['stores']} stores; "
          f"{t['untouched_blocks']} never touched; {t['use_after_free_blocks']} used after free",
          file=out)
    if t.get("allocator_accesses"):
        print(f"   the allocator's own accesses (malloc, free... keeping their books in the "
              f"blocks): {t['allocator_accesses']}, not the program's use after free", file=out)
    if not usage.blocks:
        print("   no heap block was allocated while tracing (or --no-alloc)", file=out)
        return
    print("\n   allocation sites:", file=out)
    table(["site", "kind", "blocks", "bytes", "loads", "stores", "accessed B", "block in B",
           "block out B", "untouched", "after free", "by allocator"],
          [[s["site"], ",".join(s["kinds"]), s["blocks"], s["bytes_allocated"], s["loads"],
            s["stores"], s["bytes"], s["block_bytes_in"], s["block_bytes_out"],
            s["untouched_blocks"], s["freed_accesses"], s["allocator_accesses"]]
           for s in usage.sites[:top]], out)
    more_rows(usage.sites, top, "sites", out)
    blocks = sorted(usage.blocks, key=lambda b: (-(b["loads"] + b["stores"]), b["id"]))
    print("\n   blocks (by accesses):", file=out)
    table(["block", "size", "loads", "stores", "accessed B", "block in B", "block out B",
           "after free", "by allocator", "freed"],
          [[b["allocated_as"], b["size"], b["loads"], b["stores"], b["bytes"], b["block_bytes_in"],
            b["block_bytes_out"], b["freed_accesses"], b["allocator_accesses"],
            "yes" if b["freed"] else ""] for b in blocks[:top]], out)
    more_rows(blocks, top, "blocks", out)
    untouched = usage.untouched
    if untouched:
        print(f"\n   never touched ({len(untouched)}): " + ", ".join(
            f"{b['allocated_as']} ({b['size']} B)" for b in untouched[:top])
            + (" …" if len(untouched) > top else ""), file=out)
    for b in usage.use_after_free[:top]:
        first = b.get("first_freed_access")
        where = (f", first by {first['instruction']} in thread {first['tid']} at offset "
                 f"{first['offset']:+d}") if first else ""
        print(f"   use after free: {b['name']}: {b['freed_accesses']} accesses"
              f"{', %d block events' % b['freed_block_events'] if b['freed_block_events'] else ''}"
              f"{where}", file=out)


# --------------------------------------------------------------------- numa
NUMA_HEADERS = ["first-touch", "unpinned-ft", "local", "remote", "unpinned-page",
                "unpinned-thread", "unpinned-both", "unknown-node"]


def _metric_cells(entry: dict) -> list:
    return [entry[m] for m in ("first_touch", "unpinned_first_touch", "local", "remote",
                               "unpinned_page", "unpinned_thread", "unpinned_both",
                               "unknown_node")]


def _cpus(cpus: list[int]) -> str:
    runs, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            runs.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ",".join(runs) or "-"


def print_numa(report, top: int, out) -> None:
    topo = report.topology
    t = report.totals
    nodes = "; ".join(f"node {n}: cpus {_cpus(c)}" for n, c in topo.nodes.items())
    print(f"== madtrace numa of {report.directory}: topology {topo.source} ({nodes}; pages "
          f"{topo.policy}{', %d bound ranges' % len(topo.ranges) if topo.ranges else ''})",
          file=out)
    print(f"   {t['accesses']} accesses on {t['pages']} pages: " + "  ".join(
        f"{h} {v}" for h, v in zip(NUMA_HEADERS, _metric_cells(t))), file=out)
    print("\n   threads:", file=out)
    table(["thread", "binding", "accesses", *NUMA_HEADERS],
          [[th["tid"], " → ".join(_cpus(b["cpus"]) for b in th["bindings"]) or "?",
            th["accesses"], *_metric_cells(th)] for th in report.threads[:top]], out)
    more_rows(report.threads, top, "threads", out)
    for title, rows in (("access sites", report.access_sites),
                        ("allocation sites", report.allocation_sites)):
        print(f"\n   {title} (remote and unpinned first):", file=out)
        table(["site", "accesses", *NUMA_HEADERS],
              [[r["site"], r["accesses"], *_metric_cells(r)] for r in rows[:top]], out)
        more_rows(rows, top, title, out)
    nodes_seen = sorted({n for row in report.matrix.values() for n in row})
    print("\n   accesses per thread and page node (? = unknown):", file=out)
    table(["thread", *[("?" if n < 0 else f"node {n}") for n in nodes_seen]],
          [[tid, *[row.get(n, 0) for n in nodes_seen]]
           for tid, row in sorted(report.matrix.items())][:top], out)


# ------------------------------------------------------------------- source
def _source_text(path: str) -> list[str] | None:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return None


def print_source(report, top: int, out) -> None:
    print(f"== madtrace source lines of {report.directory}", file=out)
    files = report.ordered_files()
    if not files:
        print("   no access was made by an instruction with a DWARF line "
              "(compile with -g)", file=out)
    for path in files:
        totals = report.file_totals(path)
        print(f"\n   {short_path(path)}: {totals[0]} loads, {totals[1]} stores, {totals[2]} bytes, "
              f"{totals[3]} block events", file=out)
        text = _source_text(path)
        rows = sorted(report.files[path].items(), key=lambda kv: (-kv[1][0] - kv[1][1] - kv[1][3],
                                                                  kv[0]))[:top]
        table(["line", "loads", "stores", "bytes", "blocks", "source"],
              [[line, r[0], r[1], r[2], r[3],
                (text[line - 1].strip()[:60] if text and line <= len(text) else "")]
               for line, r in sorted(rows)], out, indent="     ", left=(5,))
        more_rows(list(report.files[path]), top, "lines", out)
    if report.without_lines:
        rows = sorted(report.without_lines.items(), key=lambda kv: (-kv[1][0] - kv[1][1], kv[0]))
        print("\n   instructions without a source line (per function):", file=out)
        table(["function", "loads", "stores", "bytes", "blocks"],
              [[name, r[0], r[1], r[2], r[3]] for name, r in rows[:top]], out)
        more_rows(rows, top, "functions", out)


def short_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


# ---------------------------------------------------------------- footprint
def _fp(entry: dict, scope: str, stat: str = "") -> str:
    suffix = f"_{stat}" if stat else ""
    return "/".join(str(entry[f"{scope}_{g}{suffix}"]) for g in ("bytes", "lines", "pages"))


def print_footprint(report, top: int, out) -> None:
    print(f"== madtrace footprint of {report.directory}: {report.calls} calls; distinct bytes/"
          f"64-byte lines/4 KiB pages touched, inclusive of callees (incl) and by the call's "
          f"own instructions (self)", file=out)
    for t in report.threads:
        print(f"   thread {t['tid']}: whole thread {_fp(t, 'incl')}, outside traced calls "
              f"{_fp(t, 'self')}", file=out)
    functions = report.function_rows()
    print("\n   functions (by largest inclusive call):", file=out)
    table(["function", "calls", "incl max", "incl mean B", "self max", "self mean B"],
          [[f["function"], f["calls"], _fp(f, "incl", "max"), f["incl_bytes_mean"],
            _fp(f, "self", "max"), f["self_bytes_mean"]] for f in functions[:top]], out)
    more_rows(functions, top, "functions", out)
    calls = report.call_rows()
    print("\n   calls (largest inclusive byte footprint first):", file=out)
    table(["call", "function", "thread", "depth", "incl", "self"],
          [[c["call_id"], c["function"], c["tid"], c["depth"], _fp(c, "incl"), _fp(c, "self")]
           for c in calls[:top]], out, left=(0, 1))
    more_rows(calls, top, "calls", out)
    print(f"   analysis memory (shadow and open calls, peak): {report.peak_memory} bytes",
          file=out)
