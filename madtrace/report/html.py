# SPDX-License-Identifier: GPL-2.0-or-later
"""HTML output: one self-contained page (inline CSS, the heat map as an
inline PNG, no script, no external resource).

Sections: the annotated sources first (NUMAPROF's most valued view): every
source file whose lines made data accesses, each line with its loads,
stores, bytes and block events (DWARF line table, analysis/source_lines.py),
shaded by accesses; whole files up to ``FULL_FILE_LINES`` lines, else the
accessed lines with ``CONTEXT`` lines around them.  Then the tables of the
other kinds the report covers (heatmap picture and regions, alloc, numa,
footprint, calls).  Each annotated line is a ``<tr class="src">`` with
``data-file``, ``data-line``, ``data-loads``, ``data-stores``,
``data-bytes`` and ``data-blocks`` attributes (the file's path relative to
the current directory when it is below it), so the page can be checked (and
scraped) without parsing its layout.
"""

from __future__ import annotations

from ..errors import writing

import base64
import html
import json
import math
import os
import tempfile

from ..trace.meta import read_meta
from .text import short_path

FULL_FILE_LINES = 3000
CONTEXT = 3
CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:2em}
h3{font-size:1em;font-family:monospace}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}
td,th{padding:1px 6px;text-align:right;white-space:nowrap}
th{background:#eee;position:sticky;top:0}
td.l,th.l{text-align:left}
table.src td.code{text-align:left;font-family:monospace;white-space:pre}
table.src td{font-family:monospace;color:#555}
table.src tr.hot td.n{color:#000;font-weight:bold}
tr.gap td{color:#999;text-align:left}
nav a{margin-right:1em}
.note{color:#666;font-size:12px}
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: list[str], rows: list[list], left: tuple[int, ...] = (0,)) -> str:
    head = "".join(f'<th class="{"l" if i in left else ""}">{_e(h)}</th>'
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i in left else ""}">{_e(c)}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _shade(value: int, largest: int) -> str:
    if value <= 0 or largest <= 0:
        return ""
    level = 1.0 if largest <= 1 else math.log(value + 1) / math.log(largest + 1)
    alpha = 0.12 + 0.6 * level
    return f' style="background:rgba(255,120,0,{alpha:.2f})"'


# ------------------------------------------------------------------ sources
def source_section(report) -> str:
    parts = ["<h2 id=\"source\">Annotated sources</h2>",
             "<p class=\"note\">loads, stores and bytes of the data accesses made by each line's "
             "instructions (DWARF line table); blocks: memcpy/memset/system calls moving memory "
             "as one event, counted at their call site.</p>"]
    files = report.ordered_files()
    if not files:
        parts.append("<p>No access was made by an instruction with a source line "
                     "(compile with -g).</p>")
    largest = max((r[0] + r[1] for lines in report.files.values() for r in lines.values()),
                   default=0)
    for path in files:
        lines = report.files[path]
        t = report.file_totals(path)
        parts.append(f"<h3>{_e(short_path(path))}</h3><p class=\"note\">{t[0]} loads, {t[1]} stores, "
                     f"{t[2]} bytes, {t[3]} block events</p>")
        try:
            with open(path, errors="replace") as f:
                text = f.read().splitlines()
        except OSError:
            text = None
            parts.append("<p class=\"note\">source file not found: accessed lines only</p>")
        count = max(len(text) if text is not None else 0, max(lines))
        if text is not None and count <= FULL_FILE_LINES:
            shown = list(range(1, count + 1))
        else:
            wanted = {n for line in lines for n in range(line - CONTEXT, line + CONTEXT + 1)
                      if 1 <= n <= count}
            shown = sorted(wanted)
        rows = ["<table class=\"src\"><tr><th>line</th><th>loads</th><th>stores</th>"
                "<th>bytes</th><th>blocks</th><th class=\"l\">source</th></tr>"]
        previous = 0
        for n in shown:
            if n != previous + 1 and previous:
                rows.append(f"<tr class=\"gap\"><td></td><td colspan=\"5\">… lines "
                            f"{previous + 1}-{n - 1}</td></tr>")
            previous = n
            code = _e(text[n - 1]) if text is not None and n <= len(text) else ""
            r = lines.get(n)
            if r is None:
                rows.append(f"<tr><td>{n}</td><td></td><td></td><td></td><td></td>"
                            f"<td class=\"code\">{code}</td></tr>")
                continue
            rows.append(
                f"<tr class=\"src hot\" data-file=\"{_e(short_path(path))}\" data-line=\"{n}\" "
                f"data-loads=\"{r[0]}\" data-stores=\"{r[1]}\" data-bytes=\"{r[2]}\" "
                f"data-blocks=\"{r[3]}\"{_shade(r[0] + r[1], largest)}><td>{n}</td>"
                f"<td class=\"n\">{r[0]}</td><td class=\"n\">{r[1]}</td><td class=\"n\">{r[2]}"
                f"</td><td class=\"n\">{r[3]}</td><td class=\"code\">{code}</td></tr>")
        rows.append("</table>")
        parts.append("".join(rows))
    if report.without_lines:
        functions = sorted(report.without_lines.items(), key=lambda kv: (-kv[1][0] - kv[1][1], kv[0]))
        parts.append("<h3>Instructions without a source line (per function)</h3>")
        parts.append(_table(["function", "loads", "stores", "bytes", "blocks"],
                            [[name, r[0], r[1], r[2], r[3]] for name, r in functions]))
    return "".join(parts)


# --------------------------------------------------------------- the others
def heatmap_section(heatmap) -> str:
    from .png import write_heatmap_png
    with tempfile.TemporaryDirectory(prefix="madtrace-html-") as tmp:
        path = os.path.join(tmp, "heatmap.png")
        width, height = write_heatmap_png(heatmap, path)
        with open(path, "rb") as f:
            data = base64.b64encode(f.read()).decode()
    rows = []
    for r in heatmap.regions:
        t = r.totals()
        rows.append([r.label, f"{r.start:#x}", f"{r.end:#x}", r.pages,
                     "yes" if r.traced else "no", t["loads"], t["stores"], t["block_events"],
                     t["touched_pages"]])
    return (f"<h2 id=\"heatmap\">Page heat map</h2><img alt=\"page heat map\" width=\"{width}\" "
            f"height=\"{height}\" src=\"data:image/png;base64,{data}\">"
            + _table(["region", "start", "end", "pages", "traced", "loads", "stores",
                      "block events", "touched pages"], rows))


def alloc_section(usage) -> str:
    t = usage.totals
    parts = [f"<h2 id=\"alloc\">Heap blocks and allocation sites</h2><p>{t['blocks']} blocks "
             f"({t['bytes_allocated']} bytes), {t['loads']} loads, {t['stores']} stores, "
             f"{t['untouched_blocks']} never touched, {t['use_after_free_blocks']} used after "
             f"free; {t.get('allocator_accesses', 0)} accesses by the allocator itself (its "
             "bookkeeping, never a use after free)</p>"]
    parts.append(_table(["site", "kind", "blocks", "bytes", "loads", "stores", "accessed B",
                         "block in B", "block out B", "untouched", "after free", "by allocator"],
                        [[s["site"], ",".join(s["kinds"]), s["blocks"], s["bytes_allocated"],
                          s["loads"], s["stores"], s["bytes"], s["block_bytes_in"],
                          s["block_bytes_out"], s["untouched_blocks"], s["freed_accesses"],
                          s["allocator_accesses"]]
                         for s in usage.sites]))
    blocks = sorted(usage.blocks, key=lambda b: (-(b["loads"] + b["stores"]), b["id"]))
    parts.append(_table(["block", "size", "loads", "stores", "accessed B", "block in B",
                         "block out B", "after free", "by allocator", "first access after free"],
                        [[b["allocated_as"], b["size"], b["loads"], b["stores"], b["bytes"],
                          b["block_bytes_in"], b["block_bytes_out"], b["freed_accesses"],
                          b["allocator_accesses"],
                          (f"{b['first_freed_access']['instruction']} (thread "
                           f"{b['first_freed_access']['tid']}, offset "
                           f"{b['first_freed_access']['offset']:+d})")
                          if b.get("first_freed_access") else ""] for b in blocks],
                        left=(0, 9)))
    return "".join(parts)


NUMA_COLUMNS = ("first_touch", "unpinned_first_touch", "local", "remote", "unpinned_page",
                "unpinned_thread", "unpinned_both", "unknown_node")


def numa_section(report) -> str:
    topo = report.topology
    heads = [c.replace("_", "-") for c in NUMA_COLUMNS]
    parts = [f"<h2 id=\"numa\">NUMA</h2><p>topology {_e(topo.source)}: "
             + "; ".join(f"node {n}: cpus {_e(c)}" for n, c in topo.nodes.items())
             + f" (pages {_e(topo.policy)})</p>",
             _table(["", "accesses", *heads], [["total", report.totals["accesses"],
                                               *[report.totals[c] for c in NUMA_COLUMNS]]])]
    for title, rows in (("threads", report.threads), ("access sites", report.access_sites),
                        ("allocation sites", report.allocation_sites)):
        parts.append(f"<h3>{title}</h3>")
        parts.append(_table(["thread" if title == "threads" else "site", "accesses", *heads],
                            [[r.get("site", r.get("tid")), r["accesses"],
                              *[r[c] for c in NUMA_COLUMNS]] for r in rows]))
    return "".join(parts)


def footprint_section(report) -> str:
    def fp(entry, scope, stat=""):
        suffix = f"_{stat}" if stat else ""
        return "/".join(str(entry[f"{scope}_{g}{suffix}"]) for g in ("bytes", "lines", "pages"))
    parts = [f"<h2 id=\"footprint\">Footprint</h2><p>{report.calls} calls; distinct bytes/"
             "lines/pages, inclusive of callees and of the call's own instructions</p>"]
    parts.append(_table(["function", "calls", "incl max", "incl mean B", "self max",
                         "self mean B"],
                        [[f["function"], f["calls"], fp(f, "incl", "max"), f["incl_bytes_mean"],
                          fp(f, "self", "max"), f["self_bytes_mean"]]
                         for f in report.function_rows()]))
    parts.append(_table(["call", "function", "thread", "depth", "incl", "self"],
                        [[c["call_id"], c["function"], c["tid"], c["depth"], fp(c, "incl"),
                          fp(c, "self")] for c in report.call_rows()], left=(0, 1)))
    return "".join(parts)


def calls_section(analysis) -> str:
    rows = sorted(analysis.functions.items(), key=lambda kv: (-kv[1]["calls"], kv[0]))
    ms = (lambda ns: "-" if ns is None else f"{ns / 1e6:.3f}")
    return ("<h2 id=\"calls\">Calls</h2>"
            + _table(["function", "calls", "completed", "unwound", "open", "incl ms", "excl ms"],
                     [[name, f["calls"], f["completed"], f["unwound"], f["open"],
                       ms(f["incl_ns"]), ms(f["excl_ns"])] for name, f in rows]))


def render(directory: str, sections: list[tuple[str, str]]) -> str:
    """The page of ``sections``: (kind, its HTML section), in page order
    (madtrace.kinds says which kinds have one, and where)."""
    meta = read_meta(directory)
    shown = [kind for kind, _ in sections]
    body = [section for _, section in sections]
    nav = "".join(f"<a href=\"#{k}\">{k}</a>" for k in shown)
    command = " ".join(meta.get("command") or []) or f"pid {meta.get('pid')}"
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>madtrace report: {_e(directory)}</title><style>{CSS}</style></head><body>"
            f"<h1>madtrace report of {_e(directory)}</h1>"
            f"<p>{_e(command)}: {_e(meta.get('outcome'))}, exit status "
            f"{_e(meta.get('exit_status'))}, {_e(meta.get('threads'))} threads, dropped events "
            f"{_e(meta.get('dropped_events', 0))}</p><nav>{nav}</nav>" + "".join(body)
            + f"<p class=\"note\">{_e(json.dumps({'kinds': shown}))}</p></body></html>\n")


def write_html(directory: str, sections: list[tuple[str, str]], path: str) -> None:
    page = render(directory, sections)
    tmp = path + ".tmp"
    with writing(path):
        with open(tmp, "w") as f:
            f.write(page)
        os.replace(tmp, path)
