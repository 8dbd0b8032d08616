# SPDX-License-Identifier: GPL-2.0-or-later
"""HTML output: one self-contained interactive page (inline CSS and script,
no external resource; everything is readable without the script, which
sorts, filters and draws the heat map: report/page_script.py).

The page (``render``) opens with the global metrics of the trace (program,
how it ended, accesses, loads and stores, bytes, block events, pages,
functions, threads, duration), then the sections of the kinds the report
covers in ``page_order``: the heat map and the heap blocks first, the other
kinds' tables, the annotated sources last.  A section with nothing to show
says so in one line (``empty``).  Only aggregates go into the page, and at
most ``MAX_ROWS`` rows per table, so a page of a large trace stays light.

Helpers every section uses (public: the sections of new kinds use them too):

* ``table(headers, rows, left=(0,), numeric=None, caption=None, limit=None)``:
  a sortable, filterable table; see its docstring.
* ``cell(text, value)``: a cell shown as ``text``, sorted on ``value``.
* ``Row(cells, attrs, cls, style)``: a row with attributes of its ``<tr>``.
* ``empty(text)``: the one line of a section with nothing to show.
* ``heading(kind, title, note)``: a section's title (and a note under it).

The heat map (``heatmap_section``) is drawn by the script on a canvas from
the aggregated cells embedded as JSON (``heatmap_data``: per region its
non-zero cells, never the accesses), zoomable, with a tooltip per page.

The annotated sources (NUMAPROF's most valued view): every source file whose
lines made data accesses, each line with its loads, stores, bytes and block
events (DWARF line table, analysis/source_lines.py), shaded by accesses;
whole files up to ``FULL_FILE_LINES`` lines, else the accessed lines with
``CONTEXT`` lines around them, ``SOURCE_ROWS`` lines in all on a page.  Each
annotated line is a ``<tr class="src">`` with ``data-file``, ``data-line``,
``data-loads``, ``data-stores``, ``data-bytes`` and ``data-blocks``
attributes (the file's path relative to the current directory when it is
below it), so the page can be checked (and scraped) without parsing its
layout.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..analysis.heatmap import COLUMNS
from ..errors import writing
from ..trace.format import PAGE
from ..trace.meta import read_meta
from .page_script import SCRIPT
from .text import short_path

FULL_FILE_LINES = 3000
CONTEXT = 3
SOURCE_ROWS = 20000           # annotated lines on a page, every file together
FILE_ROWS = 4000              # annotated lines of one file (with its gaps: < MAX_ROWS)
OPEN_FILES = 3                # source files shown unfolded
MAX_ROWS = 5000               # rows of a table embedded in the page
VISIBLE_ROWS = 25             # rows shown before "show all"
FILTER_ROWS = 8               # tables of more rows get a filter box
FIRST = ("heatmap", "alloc")  # page_order: these sections first,
LAST = ("source",)            # these last, the others between in the registry's order

CSS = """
:root{--line:#d8dce3;--muted:#667;--accent:#c84b00}
body{font-family:system-ui,sans-serif;margin:0 1.5em 2em;color:#222;line-height:1.35}
h1{font-size:1.35em;margin:.6em 0 .2em}
h2{font-size:1.15em;border-bottom:1px solid var(--line);margin:1.6em 0 .4em;padding-bottom:.15em}
h3{font-size:1em;font-family:monospace;margin:1em 0 .3em}
header.metrics{border-bottom:2px solid var(--line);padding-bottom:.6em}
.command{font-family:monospace;color:#333;word-break:break-all}
.cards{display:flex;flex-wrap:wrap;gap:.5em;margin:.6em 0}
.card{border:1px solid var(--line);border-radius:6px;padding:.3em .7em;min-width:6.5em;background:#fafbfc}
.card .v{display:block;font-size:1.15em;font-weight:600}
.card .k{display:block;font-size:11px;color:var(--muted)}
.card.warn{border-color:var(--accent)}
nav a{margin-right:1em}
.note{color:var(--muted);font-size:12px}
p.empty{color:var(--muted);font-style:italic;margin:.3em 0}
.tbl{margin:.5em 0 1em}
.tbl-head{display:flex;gap:.8em;align-items:baseline;font-size:12px;margin-bottom:.2em}
.tbl-head .caption{font-weight:600;font-size:13px}
.tbl-head input{font-size:12px;padding:1px 4px;width:14em}
.tbl-foot{font-size:12px}
.tbl-foot button{font-size:12px}
table{border-collapse:collapse;font-size:12px}
td,th{padding:1px 6px;text-align:right;white-space:nowrap}
th{background:#eef0f3;position:sticky;top:0;cursor:pointer;user-select:none}
th:hover{background:#e2e6eb}
th[aria-sort=ascending]::after{content:" \\25B2";font-size:9px}
th[aria-sort=descending]::after{content:" \\25BC";font-size:9px}
tbody tr:nth-child(even){background:#f8f9fa}
td.l,th.l{text-align:left}
table.src td{font-family:monospace;color:#555}
table.src td:last-child{text-align:left;white-space:pre;color:#222}
table.src tr.hot td:nth-child(n+2):nth-child(-n+5){color:#000;font-weight:bold}
table.src tbody tr{background:none}
tr.gap td{color:#999;text-align:left;font-style:italic}
details>summary{cursor:pointer;margin:.4em 0}
.hm{position:relative;margin:.5em 0}
.hm-bar{display:flex;gap:.6em;align-items:center;font-size:12px;margin-bottom:.3em;flex-wrap:wrap}
.hm-bar button{font-size:12px;min-width:2em}
.hm-view{position:relative;overflow:auto;border:1px solid var(--line);height:60vh}
.hm-view canvas{position:absolute;left:0;top:0;display:block}
.hm-space{pointer-events:none}
.hm-tip{position:absolute;z-index:5;background:#fff;border:1px solid #999;border-radius:4px;
padding:3px 6px;font-size:12px;box-shadow:0 2px 6px rgba(0,0,0,.2);pointer-events:none;max-width:40em}
.scale{display:inline-block;width:12em;height:10px;vertical-align:middle;border:1px solid #ccc;
background:linear-gradient(to right,#fed976,#feb24c,#fd8d3c,#fc4e2a,#e31a1c,#bd0026,#800026)}
.swatch{display:inline-block;width:10px;height:10px;vertical-align:middle;border:1px solid #ccc}
"""
NOSCRIPT = "<noscript><style>tr[hidden]{display:table-row!important}.hm-view{display:none}</style></noscript>"


def _e(value) -> str:
    return html.escape(str(value), quote=True)


# ------------------------------------------------------------------- tables
@dataclass(frozen=True)
class Cell:
    """A table cell shown as ``text`` and sorted on ``value`` (its ``data-v``)."""
    text: str
    value: Any


def cell(text, value) -> Cell:
    """A cell shown as ``text`` (formatted: a size, a hex address, a time)
    that sorts on ``value`` (a number, or a string; None: empty, sorted last)."""
    return Cell(str(text), value)


@dataclass(frozen=True)
class Row:
    """A table row whose ``<tr>`` has attributes: ``attrs`` (name -> value,
    e.g. ``data-file``), ``cls`` (classes), ``style``.  ``gap``: a row that
    only says ``gap`` (lines left out of an annotated source), its first
    cell ``cells[0]`` (sorting on the first column places it)."""
    cells: Sequence
    attrs: Mapping[str, Any] = field(default_factory=dict)
    cls: str = ""
    style: str = ""
    gap: str | None = None


def _raw(value):
    return value.value if isinstance(value, Cell) else value


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _shown(value, plain: bool) -> tuple[str, str | None]:
    """(text shown, data-v or None) of a cell."""
    if isinstance(value, Cell):
        v = value.value
        return value.text, ("" if v is None else str(v))
    if value is None:
        return "", None
    if isinstance(value, bool):
        return ("yes" if value else "no"), None
    if _is_number(value):
        if isinstance(value, (float, np.floating)):
            text = f"{value:,.2f}" if not plain else f"{value:.2f}"
        else:
            text = str(int(value)) if plain else f"{int(value):,}"
        return text, (None if text == str(value) else str(value))
    return str(value), None


def _alpha(value, largest) -> float:
    if not _is_number(value) or value <= 0 or largest <= 0:
        return 0.0
    level = 1.0 if largest <= 1 else math.log(value + 1) / math.log(largest + 1)
    return 0.12 + 0.6 * level


def _shade(value, largest) -> str:
    alpha = _alpha(value, largest)
    return f"background:rgba(255,120,0,{alpha:.2f})" if alpha else ""


def table(headers: Sequence[str], rows: Sequence, left: Sequence[int] = (0,),
          numeric: Sequence[int] | None = None, caption: str | None = None,
          limit: int | None = None, *, total: int | None = None, plain: Sequence[int] = (),
          shade: Sequence[int] = (), cls: str = "") -> str:
    """A table the page's script makes sortable (click a header) and
    filterable (a box above tables of more than ``FILTER_ROWS`` rows).

    ``headers``: the column titles.  ``rows``: sequences of cells, or
    ``Row`` (cells with attributes of their ``<tr>``); a cell is a value
    shown as is (int and float with thousands separators, None empty, bool
    yes/no) or ``cell(text, value)``: shown as text, sorted on the value.
    Where the text differs from the raw value the ``<td>`` has it in
    ``data-v``.  ``left``: columns aligned left (names).  ``numeric``: the
    columns sorted as numbers (default: those whose values are all numbers
    or None); the others sort as text.  ``caption``: a title above the
    table.  ``limit``: rows visible before a "show all" button (default
    ``VISIBLE_ROWS``; 0: all); sorting and filtering work on every row.
    At most ``MAX_ROWS`` rows go into the page, and a note says how many
    were left out of ``total`` (default: ``len(rows)``; give it when the
    caller cut the rows itself).  ``plain``: numeric columns shown without
    thousands separators (ids, line numbers).  ``shade``: columns whose
    cells are shaded by their value (log scale, the largest of them all
    the darkest).  ``cls``: classes of the ``<table>``.  No row: one line
    saying so.
    """
    given = len(rows) if hasattr(rows, "__len__") else None
    rows = list(itertools.islice(rows, MAX_ROWS))
    total = max(total if total is not None else (given or 0), len(rows))
    if not rows:
        return empty(f"{caption}: none." if caption else "No rows.")
    limit = VISIBLE_ROWS if limit is None else max(limit, 0)
    left_set, plain_set, shade_set = set(left), set(plain), set(shade)

    def cells_of(row) -> Sequence:
        return row.cells if isinstance(row, Row) else row

    width = len(headers)
    if numeric is None:
        numbers = []
        for i in range(width):
            values = [_raw(c[i]) for c in (cells_of(r) for r in rows
                                           if not (isinstance(r, Row) and r.gap is not None))
                      if i < len(c) and _raw(c[i]) is not None]
            numbers.append(bool(values) and all(_is_number(v) for v in values))
        num_set = {i for i, n in enumerate(numbers) if n}
    else:
        num_set = set(numeric)
    largest = max((_raw(c[i]) for r in rows for c in [cells_of(r)] for i in shade_set
                   if i < len(c) and _is_number(_raw(c[i]))), default=0)

    head = "".join(f'<th class="{"l" if i in left_set else ""}" '
                   f'data-type="{"num" if i in num_set else "text"}">{_e(h)}</th>'
                   for i, h in enumerate(headers))
    body = []
    shown = 0
    for row in rows:
        attrs = ""
        classes, style = [], ""
        if isinstance(row, Row):
            attrs = "".join(f' {_e(k)}="{_e(v)}"' for k, v in row.attrs.items())
            classes = row.cls.split()
            style = row.style
        if isinstance(row, Row) and row.gap is not None:
            first = _raw(row.cells[0]) if row.cells else None
            hidden = limit and shown >= limit
            body.append(f'<tr class="gap"{" hidden" if hidden else ""}><td data-v="{_e(first)}"></td>'
                        f'<td colspan="{max(width - 1, 1)}">{_e(row.gap)}</td></tr>')
            continue
        hidden = bool(limit) and shown >= limit
        shown += 1
        tds = []
        for i, value in enumerate(cells_of(row)):
            text, v = _shown(value, i in plain_set)
            klass = ' class="l"' if i in left_set else ""
            data = f' data-v="{_e(v)}"' if v is not None else ""
            tint = f' style="{_shade(_raw(value), largest)}"' if i in shade_set and \
                _shade(_raw(value), largest) else ""
            tds.append(f"<td{klass}{data}{tint}>{_e(text)}</td>")
        klass = f' class="{_e(" ".join(classes))}"' if classes else ""
        tstyle = f' style="{_e(style)}"' if style else ""
        body.append(f"<tr{klass}{attrs}{tstyle}{' hidden' if hidden else ''}>{''.join(tds)}</tr>")
    real = sum(1 for r in rows if not (isinstance(r, Row) and r.gap is not None))
    tools = []
    if caption:
        tools.append(f'<span class="caption">{_e(caption)}</span>')
    if real > FILTER_ROWS:
        tools.append('<input type="search" class="filter" placeholder="filter rows" '
                     'aria-label="filter rows">')
        tools.append(f'<span class="count note">{real} rows</span>')
    foot = []
    if limit and real > limit:
        foot.append(f'<button type="button" class="all">show all {real} rows</button>')
    if total > len(rows):
        foot.append(f'<span class="note">{total - len(rows)} more rows are not in the page '
                    "(the --json report has them all)</span>")
    table_cls = " ".join(["sortable", *cls.split()])
    return (f'<div class="tbl" data-limit="{limit}" data-rows="{real}" data-total="{total}">'
            f'<div class="tbl-head">{"".join(tools)}</div>'
            f'<table class="{_e(table_cls)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>'
            + (f'<div class="tbl-foot">{" ".join(foot)}</div>' if foot else "") + "</div>")


def empty(text: str) -> str:
    """The one line of a section (or part of one) with nothing to show."""
    return f'<p class="empty">{_e(text)}</p>'


def heading(kind: str, title: str, note: str | None = None) -> str:
    """A section's title (its id: the kind's name), and a note under it."""
    out = f'<h2 id="{_e(kind)}">{_e(title)}</h2>'
    return out + (f'<p class="note">{_e(note)}</p>' if note else "")


def _hex(value: int) -> Cell:
    return cell(f"{value:#x}", value)


# ------------------------------------------------------------------ sources
def _source_lines(lines: dict, text: list[str] | None, budget: int) -> tuple[list[int], int]:
    """The lines of a file to show (whole, or the accessed lines in context;
    without its text, the accessed lines only; the most accessed first when
    ``budget`` lines do not hold them all) and how many accessed lines were
    left out."""
    count = max(len(text) if text is not None else 0, max(lines))
    if text is not None and count <= min(FULL_FILE_LINES, budget):
        return list(range(1, count + 1)), 0
    context = CONTEXT if text is not None else 0
    hottest = sorted(lines, key=lambda n: (-(lines[n][0] + lines[n][1] + lines[n][3]), n))
    wanted: set[int] = set()
    kept = 0
    for line in hottest:
        around = {n for n in range(line - context, line + context + 1) if 1 <= n <= count}
        if len(wanted | around) > budget and kept:
            break
        wanted |= around
        kept += 1
    return sorted(wanted), len(lines) - kept


def _source_table(path: str, lines: dict, text: list[str] | None, shown: list[int],
                  largest: int) -> str:
    rows: list = []
    previous = 0
    name = short_path(path)
    for n in shown:
        if n != previous + 1 and previous:
            rows.append(Row([previous + 1], gap=f"… lines {previous + 1}-{n - 1}"))
        previous = n
        code = text[n - 1] if text is not None and n <= len(text) else ""
        r = lines.get(n)
        if r is None:
            rows.append([n, None, None, None, None, code])
            continue
        rows.append(Row([n, r[0], r[1], r[2], r[3], code],
                        attrs={"data-file": name, "data-line": n, "data-loads": r[0],
                               "data-stores": r[1], "data-bytes": r[2], "data-blocks": r[3]},
                        cls="src hot", style=_shade(r[0] + r[1], largest)))
    return table(["line", "loads", "stores", "bytes", "blocks", "source"], rows, left=(5,),
                 numeric=(0, 1, 2, 3, 4), limit=0 if text is not None else 2 * VISIBLE_ROWS,
                 plain=(0,), cls="src")


def source_section(report) -> str:
    parts = [heading("source", "Annotated sources",
                     "loads, stores and bytes of the data accesses made by each line's "
                     "instructions (DWARF line table); blocks: memcpy/memset/system calls "
                     "moving memory as one event, counted at their call site.")]
    files = report.ordered_files()
    if not files:
        parts.append(empty("No access was made by an instruction with a source line "
                           "(compile with -g)."))
    largest = max((r[0] + r[1] for lines in report.files.values() for r in lines.values()),
                  default=0)
    budget = SOURCE_ROWS
    left_out = []
    for number, path in enumerate(files):
        lines = report.files[path]
        t = report.file_totals(path)
        if budget <= 0:
            left_out.append([short_path(path), t[0], t[1], t[2], t[3], len(lines)])
            continue
        try:
            with open(path, errors="replace") as f:
                text: list[str] | None = f.read().splitlines()
        except OSError:
            text = None
        shown, missing = _source_lines(lines, text, min(budget, FILE_ROWS))
        budget -= len(shown)
        notes = [f"{t[0]:,} loads, {t[1]:,} stores, {t[2]:,} bytes, {t[3]:,} block events"]
        if text is None:
            notes.append("source file not found: accessed lines only")
        if missing:
            notes.append(f"{missing} accessed lines left out (the most accessed shown; "
                         "--kind source --json lists them all)")
        parts.append(f"<details{' open' if number < OPEN_FILES else ''} class=\"file\">"
                     f"<summary><h3 style=\"display:inline\">{_e(short_path(path))}</h3> "
                     f"<span class=\"note\">{_e('; '.join(notes))}</span></summary>"
                     + _source_table(path, lines, text, shown, largest) + "</details>")
    if left_out:
        parts.append(table(["file", "loads", "stores", "bytes", "blocks", "lines accessed"],
                           left_out, caption="Other source files (not annotated here)"))
    if report.without_lines:
        functions = sorted(report.without_lines.items(),
                           key=lambda kv: (-kv[1][0] - kv[1][1], kv[0]))
        parts.append(f"<details><summary>Instructions without a source line, per function: "
                     f"{len(functions)} functions, {sum(r[0] + r[1] for _, r in functions):,} "
                     "accesses</summary>"
                     + table(["function", "loads", "stores", "bytes", "blocks"],
                             [[name, r[0], r[1], r[2], r[3]] for name, r in functions],
                             limit=20) + "</details>")
    return "".join(parts)


# ----------------------------------------------------------------- heat map
def heatmap_data(heatmap) -> dict:
    """What the page's script draws: per region its label, bounds, totals
    and non-zero cells ``[cell, loads, stores, block events]`` (cells of
    ``cell_pages`` pages, ``columns`` per row); ``max_cell``: the largest
    cell value (accesses + block events)."""
    regions = []
    for r in heatmap.regions:
        t = r.totals()
        entry = {"label": r.label, "start": f"{r.start:#x}", "end": f"{r.end:#x}",
                 "first_page": f"{r.first_page:#x}", "pages": r.pages, "cells": r.cells,
                 "cell_pages": r.cell_pages, "traced": r.traced, **t, "data": []}
        if r.counts is not None:
            padded = np.zeros((r.cells * r.cell_pages, 3), dtype=np.int64)
            padded[:len(r.counts)] = r.counts
            per_cell = padded.reshape(r.cells, r.cell_pages, 3).sum(axis=1)
            touched = np.flatnonzero(per_cell.sum(axis=1))
            entry["data"] = [[int(k), *map(int, per_cell[k])] for k in touched]
        regions.append(entry)
    return {"columns": COLUMNS, "page_size": PAGE, "max_cell": heatmap.max_cell,
            "regions": regions}


def _json_script(value, cls: str) -> str:
    text = json.dumps(value, separators=(",", ":")).replace("<", "\\u003c")
    return f'<script type="application/json" class="{cls}">{text}</script>'


def heatmap_section(heatmap) -> str:
    totals = {k: sum(r.totals()[k] for r in heatmap.regions)
              for k in ("loads", "stores", "block_events", "touched_pages")}
    if heatmap.accesses is not None:
        totals.update(heatmap.accesses)
    parts = [heading("heatmap", "Page heat map")]
    if not heatmap.regions:
        return parts[0] + empty("No data region to draw.")
    untraced = sum(1 for r in heatmap.regions if not r.traced)
    parts.append(
        f"<p>{totals['loads'] + totals['stores']:,} accesses ({totals['loads']:,} loads, "
        f"{totals['stores']:,} stores), {totals['block_events']:,} block events on "
        f"{totals['touched_pages']:,} touched pages of {len(heatmap.regions)} regions "
        f"({untraced} not traced).</p>"
        "<p class=\"note\">One cell per page (or per group of pages in large regions), low "
        "addresses at the top; colour: accesses + block events, log scale; "
        "<span class=\"swatch\" style=\"background:#e6f0ff\"></span> traced, not accessed; "
        "<span class=\"swatch\" style=\"background:#b8b8b8\"></span> not traced; a region "
        "without any access takes one line. Zoom: the buttons, Ctrl+wheel or +/- over the map; hover a cell for its "
        "page and counts.</p>")
    parts.append(
        '<div class="hm"><div class="hm-bar">'
        '<button type="button" data-zoom="-1" title="zoom out">&minus;</button>'
        '<button type="button" data-zoom="1" title="zoom in">+</button>'
        '<button type="button" data-zoom="0" title="back to the first zoom">reset</button>'
        '<span class="hm-zoom note"></span>'
        '<label><input type="checkbox" class="hm-fold" checked> fold rows of untouched '
        'pages</label>'
        f'<span>1 <span class="scale"></span> {max(heatmap.max_cell, 1):,} per cell</span></div>'
        '<div class="hm-view" tabindex="0" aria-label="page heat map">'
        '<canvas class="hm-canvas" width="0" height="0"></canvas><div class="hm-space"></div></div>'
        '<div class="hm-tip" hidden></div>'
        + _json_script(heatmap_data(heatmap), "hm-data")
        + "<noscript><p class=\"note\">The heat map is drawn by the page's script; "
          "<code>madtrace report --kind heatmap --png FILE</code> draws it as a picture."
          "</p></noscript></div>")
    rows = []
    for r in heatmap.regions:
        t = r.totals()
        rows.append([r.label, _hex(r.start), _hex(r.end), r.pages, r.traced, t["loads"],
                     t["stores"], t["block_events"], t["touched_pages"]])
    rows.sort(key=lambda row: (-(row[5] + row[6] + row[7]), _raw(row[1])))
    parts.append(table(["region", "start", "end", "pages", "traced", "loads", "stores",
                        "block events", "touched pages"], rows, limit=15,
                       caption="Regions, the most accessed first"))
    return "".join(parts)


# --------------------------------------------------------------- the others
def alloc_section(usage) -> str:
    t = usage.totals
    head = heading("alloc", "Heap blocks and allocation sites")
    if not usage.blocks:
        return head + empty("No heap block was allocated while the program was traced.")
    parts = [head, f"<p>{t['blocks']:,} blocks ({t['bytes_allocated']:,} bytes), "
             f"{t['loads']:,} loads, {t['stores']:,} stores, {t['untouched_blocks']:,} never "
             f"touched, {t['use_after_free_blocks']:,} used after free; "
             f"{t.get('allocator_accesses', 0):,} accesses by the allocator itself (its "
             "bookkeeping, never a use after free)</p>"]
    parts.append(table(["site", "kind", "blocks", "bytes", "loads", "stores", "accessed B",
                        "block in B", "block out B", "untouched", "after free", "by allocator"],
                       [[s["site"], ",".join(s["kinds"]), s["blocks"], s["bytes_allocated"],
                         s["loads"], s["stores"], s["bytes"], s["block_bytes_in"],
                         s["block_bytes_out"], s["untouched_blocks"], s["freed_accesses"],
                         s["allocator_accesses"]]
                        for s in usage.sites], left=(0, 1), caption="Allocation sites"))
    blocks = sorted(usage.blocks, key=lambda b: (-(b["loads"] + b["stores"]), b["id"]))
    parts.append(table(["block", "size", "loads", "stores", "accessed B", "block in B",
                        "block out B", "after free", "by allocator", "first access after free"],
                       [[b["allocated_as"], b["size"], b["loads"], b["stores"], b["bytes"],
                         b["block_bytes_in"], b["block_bytes_out"], b["freed_accesses"],
                         b["allocator_accesses"],
                         (f"{b['first_freed_access']['instruction']} (thread "
                          f"{b['first_freed_access']['tid']}, offset "
                          f"{b['first_freed_access']['offset']:+d})")
                         if b.get("first_freed_access") else ""]
                        for b in blocks[:MAX_ROWS]], left=(0, 9), total=len(blocks),
                       caption="Blocks, the most accessed first"))
    return "".join(parts)


NUMA_COLUMNS = ("first_touch", "unpinned_first_touch", "local", "remote", "unpinned_page",
                "unpinned_thread", "unpinned_both", "unknown_node")


def numa_section(report) -> str:
    topo = report.topology
    heads = [c.replace("_", "-") for c in NUMA_COLUMNS]
    parts = [heading("numa", "NUMA", f"topology {topo.source}: "
                     + "; ".join(f"node {n}: cpus {c}" for n, c in topo.nodes.items())
                     + f" (pages {topo.policy})")]
    if not report.totals.get("accesses"):
        return parts[0] + empty("No access to place on a NUMA node.")
    parts.append(table(["", "accesses", *heads], [["total", report.totals["accesses"],
                                                   *[report.totals[c] for c in NUMA_COLUMNS]]]))
    nodes = sorted({n for row in report.matrix.values() for n in row})
    if nodes:
        parts.append(table(["thread", *[("unknown node" if n < 0 else f"node {n}") for n in nodes],
                            "accesses"],
                           [[tid, *[row.get(n, 0) for n in nodes], sum(row.values())]
                            for tid, row in sorted(report.matrix.items())],
                           plain=(0,), shade=tuple(range(1, len(nodes) + 1)),
                           caption="Accesses per thread and node of the page (shaded)"))
    for title, rows in (("Threads", report.threads), ("Access sites", report.access_sites),
                        ("Allocation sites", report.allocation_sites)):
        parts.append(table(["thread" if title == "Threads" else "site", "accesses", *heads],
                           [[r.get("site", r.get("tid")), r["accesses"],
                             *[r[c] for c in NUMA_COLUMNS]] for r in rows],
                           plain=(0,) if title == "Threads" else (), caption=title))
    return "".join(parts)


def footprint_section(report) -> str:
    head = heading("footprint", "Footprint",
                   f"{report.calls:,} calls; distinct bytes, 64-byte lines and pages, "
                   "inclusive of callees (incl) and by the call's own instructions (self)")
    functions = report.function_rows()
    if not functions:
        return head + empty("No traced call made a data access.")
    parts = [head, table(["function", "calls", "incl max B", "incl max lines", "incl max pages",
                          "incl mean B", "self max B", "self max lines", "self max pages",
                          "self mean B"],
                         [[f["function"], f["calls"], f["incl_bytes_max"], f["incl_lines_max"],
                           f["incl_pages_max"], f["incl_bytes_mean"], f["self_bytes_max"],
                           f["self_lines_max"], f["self_pages_max"], f["self_bytes_mean"]]
                          for f in functions], caption="Functions")]
    calls = report.call_rows()
    if calls:
        parts.append(table(["call", "function", "thread", "depth", "incl B", "incl lines",
                            "incl pages", "self B", "self lines", "self pages"],
                           [[c["call_id"], c["function"], c["tid"], c["depth"], c["incl_bytes"],
                             c["incl_lines"], c["incl_pages"], c["self_bytes"], c["self_lines"],
                             c["self_pages"]] for c in calls],
                           left=(1,), plain=(0, 2), caption="The largest calls"))
    return "".join(parts)


def calls_section(analysis) -> str:
    head = heading("calls", "Calls")
    rows = sorted(analysis.functions.items(), key=lambda kv: (-kv[1]["calls"], kv[0]))
    if not rows:
        return head + empty("No call of a traced function was recorded.")

    def ms(ns):
        return cell("-", None) if ns is None else cell(f"{ns / 1e6:,.3f}", ns)
    return head + table(["function", "calls", "completed", "unwound", "open", "incl ms", "excl ms"],
                        [[name, f["calls"], f["completed"], f["unwound"], f["open"],
                          ms(f["incl_ns"]), ms(f["excl_ns"])] for name, f in rows],
                        numeric=(1, 2, 3, 4, 5, 6), caption="Functions, the most called first")


# ------------------------------------------------------------------- header
def ending(meta: dict) -> str:
    """How the recording ended, in words (an attached process's exit status
    is not known: it was left running)."""
    outcome = meta.get("outcome")
    if outcome == "snapshot":
        return "still running (a snapshot saved from the REPL)"
    if outcome == "tracer killed":
        return "cut short: madtrace was killed (a partial trace)"
    if outcome == "running":
        return "still being recorded"
    if outcome == "exec":
        return f"exec of {' '.join(meta.get('next_command') or [])[:60]}"
    if meta.get("exit_signal"):
        return f"killed by signal {meta['exit_signal']}"
    if meta.get("exit_status") is not None:
        return f"exit status {meta['exit_status']}"
    if outcome == "detached" or meta.get("mode") == "attach":
        reason = meta.get("stop_reason")
        return "detached" + (f" ({reason})" if reason else "") + ", the process kept running"
    return str(outcome or "unknown")


def metrics(meta: dict, results: Mapping[str, Any] | None = None) -> list[tuple[str, str, Any, str]]:
    """The header's metrics: (key, label, value, shown) each; from meta.json
    and, when the page has them, the analyses' results (``results``: kind
    name -> result; the source report counts loads, stores and bytes)."""
    results = results or {}
    out: list[tuple[str, str, Any, str]] = []

    def add(key: str, label: str, value, shown: str | None = None) -> None:
        out.append((key, label, value, shown if shown is not None else
                    (f"{value:,}" if _is_number(value) else str(value))))

    source, heat = results.get("source"), results.get("heatmap")
    counted = (meta.get("accesses") or {}).values()
    loads = stores = nbytes = blocks = None
    if source is not None:
        rows = [r for lines in source.files.values() for r in lines.values()]
        rows += list(source.without_lines.values())
        loads, stores = sum(r[0] for r in rows), sum(r[1] for r in rows)
        nbytes, blocks = sum(r[2] for r in rows), sum(r[3] for r in rows)
    elif heat is not None and heat.accesses is not None:
        loads, stores = heat.accesses["loads"], heat.accesses["stores"]
    elif counted:
        try:
            loads = sum(int(c["L"]) for c in counted)
            stores = sum(int(c["S"]) for c in counted)
        except (KeyError, TypeError, ValueError):
            loads = stores = None
    if loads is not None and stores is not None:
        add("accesses", "accesses", loads + stores)
        add("loads", "loads", loads)
        add("stores", "stores", stores)
    if nbytes is not None:
        add("bytes", "bytes accessed", nbytes)
    if blocks:
        add("block_events", "block events", blocks)
    if heat is not None:
        add("touched_pages", "pages touched", sum(r.totals()["touched_pages"] for r in heat.regions))
    calls = meta.get("calls") or {}
    if calls:
        add("functions", "functions called", len([f for f, n in calls.items() if n]))
        add("calls", "calls", sum(int(n) for n in calls.values()))
    if meta.get("threads") is not None:
        add("threads", "threads", meta["threads"])
    if "end_time" in meta and "start_time" in meta:
        seconds = float(meta["end_time"]) - float(meta["start_time"])
        add("duration", "duration", round(seconds, 6), f"{seconds:.3f} s")
    add("ended", "ended", ending(meta))
    dropped = meta.get("dropped_events") or 0
    if dropped:
        add("dropped_events", "dropped events", dropped)
    return out


def _header(directory: str, meta: dict, results, shown: list[str]) -> str:
    command = " ".join(meta.get("command") or [])
    pid = meta.get("pid")
    program = command or f"pid {pid}"
    attached = meta.get("mode") == "attach"
    cards = []
    for key, label, value, text in metrics(meta, results):
        warn = " warn" if key == "dropped_events" else ""
        cards.append(f'<div class="card{warn}" data-metric="{_e(key)}" data-v="{_e(value)}">'
                     f'<span class="v">{_e(text)}</span><span class="k">{_e(label)}</span></div>')
    nav = "".join(f'<a href="#kind-{_e(k)}">{_e(k)}</a>' for k in shown)
    how = f"attached to pid {pid}" if attached else f"pid {pid}"
    return (f'<header class="metrics" id="metrics"><h1>madtrace report: '
            f'{_e(os.path.basename((meta.get("command") or [program])[0]))}</h1>'
            f'<div class="command" title="{_e(program)}">{_e(program[:300])}</div>'
            f'<div class="note">trace {_e(directory)}; {_e(how)}</div>'
            f'<div class="cards">{"".join(cards)}</div><nav>{nav}</nav></header>')


# --------------------------------------------------------------------- page
def page_order(kinds: list[str]) -> list[str]:
    """The sections' order on the page: ``FIRST``, the others as given
    (the registry's html_order), ``LAST``."""
    first = [k for k in FIRST if k in kinds]
    last = [k for k in LAST if k in kinds]
    return first + [k for k in kinds if k not in first and k not in last] + last


def render(directory: str, sections: list[tuple[str, str]],
           results: Mapping[str, Any] | None = None) -> str:
    """The page of ``sections``: (kind, its HTML section), in the registry's
    html_order (madtrace.kinds says which kinds have one), placed by
    ``page_order``; ``results``: kind -> its analysis, for the header."""
    meta = read_meta(directory)
    by_kind = dict(sections)
    shown = page_order([kind for kind, _ in sections])
    body = "".join(f'<section class="kind" id="kind-{_e(k)}" data-kind="{_e(k)}">{by_kind[k]}'
                   "</section>" for k in shown)
    command = meta.get("command") or []
    title = os.path.basename(command[0]) if command else f"pid {meta.get('pid')}"
    assert "</script" not in SCRIPT
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>madtrace report: {_e(title)} ({_e(directory)})</title>"
            f"<style>{CSS}</style>{NOSCRIPT}</head><body>"
            + _header(directory, meta, results, shown) + body
            + _json_script({"kinds": shown, "directory": directory}, "report-kinds")
            + f"<script>{SCRIPT}</script></body></html>\n")


def write_html(directory: str, sections: list[tuple[str, str]], path: str,
               results: Mapping[str, Any] | None = None) -> None:
    page = render(directory, sections, results)
    tmp = path + ".tmp"
    with writing(path):
        with open(tmp, "w") as f:
            f.write(page)
        os.replace(tmp, path)
