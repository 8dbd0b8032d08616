# SPDX-License-Identifier: GPL-2.0-or-later
"""PNG output: the page heat map (MadT's Fig. 1), drawn pixel-exact.

The grid is a numpy RGB image placed unscaled on a matplotlib figure (Agg
backend, no display needed) with the labels and the colour scale drawn as
text on top; ``layout(heatmap)`` gives where every region and cell is, so
a reader (and the tests) can find the cell of any page:

* width ``WIDTH`` px; a title band of ``TOP`` px, then the regions top
  (lowest address) to bottom, each a label line of ``GAP`` px (its label
  left of ``GRID_X``, its address, pages and counts right of it: each
  shortened to fit, never over the other or another region's) then
  ``rows * CELL`` px of cells; the colour scale in the last ``BOTTOM`` px;
* a region with no access (untraced: grey; or traced but never accessed)
  takes one row: its first ``COLUMNS`` cells, whatever its size; in the
  others, a run of ``FOLD_ROWS`` rows or more of untouched pages is folded
  into one row (a bar of ``UNTOUCHED``, "N rows untouched" left of it);
* cell ``k`` of a region is at x = ``GRID_X + (k % COLUMNS) * CELL``,
  y = region top + ``box.row_of[k // COLUMNS] * CELL``, ``CELL - 1`` px
  square (``cell_origin``; a cell of a folded row: a pixel of its bar);
* colours: untraced regions ``GREY``, traced pages never touched
  ``UNTOUCHED`` (pale blue), touched pages the ``YlOrRd`` colour map on a
  log scale from ``COLOR_LOW`` (1 access) to 1.0 (the largest cell).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..analysis.heatmap import COLUMNS, Heatmap
from ..errors import MadtraceError, writing

CELL = 8                      # px per cell, 1 px of it a gap
GRID_X = 330                  # left of the grid: the labels
WIDTH = GRID_X + COLUMNS * CELL + 16
TOP = 46
GAP = 14                      # between regions (a label line above each grid)
BOTTOM = 50
FOLD_ROWS = 3                 # runs of this many untouched rows or more: one row
DPI = 100
GREY = (0.72, 0.72, 0.72)
UNTOUCHED = (0.90, 0.94, 1.0)
BACKGROUND = (1.0, 1.0, 1.0)
COLOR_LOW = 0.25
CMAP = "YlOrRd"


@dataclass
class RegionBox:
    top: int                  # y of the first row of cells
    rows: int                 # rows drawn
    row_of: list[int] = field(default_factory=list)     # drawn row of each row of cells
    folds: list[tuple[int, int]] = field(default_factory=list)   # (drawn row, rows in it)


def _mpl():
    try:
        import matplotlib
        matplotlib.use("Agg", force=True)
        from matplotlib import colormaps
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:   # a dependency of madtrace: a broken installation
        raise MadtraceError(f"--png needs matplotlib ({exc})") from None
    return colormaps, Figure, FigureCanvasAgg


def _accessed(r) -> bool:
    return r.counts is not None and bool(r.counts.any())


def layout(heatmap: Heatmap) -> tuple[list[RegionBox], int]:
    """The box of each region (in ``heatmap.regions`` order) and the image height."""
    boxes = []
    y = TOP
    for r in heatmap.regions:
        rows = max(1, -(-r.cells // COLUMNS))
        box = RegionBox(y + GAP, 1, [0] * rows)
        if _accessed(r):
            values = r.cell_values()
            used = np.zeros(rows * COLUMNS, dtype=bool)
            used[:len(values)] = values > 0
            has = [bool(x) for x in np.count_nonzero(used.reshape(rows, COLUMNS), axis=1)]
            box.row_of, drawn, i = [], 0, 0
            while i < rows:
                j = i
                while j < rows and not has[j]:
                    j += 1
                if j - i >= FOLD_ROWS:
                    box.row_of += [drawn] * (j - i)
                    box.folds.append((drawn, j - i))
                    drawn, i = drawn + 1, j
                    continue
                box.row_of.append(drawn)
                drawn, i = drawn + 1, i + 1
            box.rows = drawn
        boxes.append(box)
        y += GAP + box.rows * CELL
    return boxes, y + BOTTOM


def cell_origin(box: RegionBox, k: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of cell ``k`` of a region."""
    row = k // COLUMNS
    drawn = box.row_of[row] if row < len(box.row_of) else row
    return GRID_X + (k % COLUMNS) * CELL, box.top + drawn * CELL


def cell_colour(value: int, largest: int, cmap) -> tuple[float, float, float]:
    if value <= 0:
        return UNTOUCHED
    level = 1.0 if largest <= 1 else math.log(value) / math.log(largest)
    return tuple(cmap(COLOR_LOW + (1 - COLOR_LOW) * min(level, 1.0))[:3])


def _fit(put, renderer, s: str, width: float):
    """The text drawn by ``put(s)`` shortened with an ellipsis until it is at
    most ``width`` px wide (measured as drawn)."""
    t = put(s)
    if t.get_window_extent(renderer).width <= width:
        return t
    lo, hi = 0, len(s) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        t.set_text(s[:mid] + "…")
        if t.get_window_extent(renderer).width <= width:
            lo = mid
        else:
            hi = mid - 1
    t.set_text(s[:lo] + "…")
    return t


def write_heatmap_png(heatmap: Heatmap, path: str) -> tuple[int, int]:
    """Writes the picture; returns its (width, height) in pixels."""
    colormaps, Figure, FigureCanvasAgg = _mpl()
    cmap = colormaps[CMAP]
    boxes, height = layout(heatmap)
    largest = heatmap.max_cell
    image = np.ones((height, WIDTH, 3), dtype=np.float64)
    image[:] = BACKGROUND
    for r, box in zip(heatmap.regions, boxes):
        values = r.cell_values()
        folded = {drawn for drawn, _ in box.folds}
        for drawn in folded:
            y = box.top + drawn * CELL
            image[y:y + CELL - 1, GRID_X:GRID_X + COLUMNS * CELL - 1] = UNTOUCHED
        for k in range(r.cells if _accessed(r) else min(r.cells, COLUMNS)):
            x, y = cell_origin(box, k)
            if (y - box.top) // CELL in folded:
                continue
            colour = GREY if values is None else cell_colour(int(values[k]), largest, cmap)
            image[y:y + CELL - 1, x:x + CELL - 1] = colour
    # the colour scale: 256 steps from 1 access to the largest cell
    scale_y = height - BOTTOM + 14
    steps = COLUMNS * CELL
    for i in range(steps):
        image[scale_y:scale_y + 12, GRID_X + i] = cmap(COLOR_LOW + (1 - COLOR_LOW) * i / (steps - 1))[:3]
    fig = Figure(figsize=(WIDTH / DPI, height / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    fig.figimage(image, xo=0, yo=0, origin="upper")

    def text(x: int, y: int, s: str, **kw):
        return fig.text(x / WIDTH, 1 - y / height, s, fontsize=kw.pop("size", 7), va="top",
                        family="DejaVu Sans", **kw)
    renderer = fig.canvas.get_renderer()

    d = heatmap.to_dict()
    text(8, 6, f"madtrace heat map of {heatmap.directory}", size=10, weight="bold")
    text(8, 24, f"{d['loads'] + d['stores']} accesses ({d['loads']} loads, {d['stores']} stores), "
                f"{d['block_events']} block events, {d['touched_pages']} pages touched; one cell "
                f"per page, low addresses at the top; grey: not traced", size=7)
    for r, box in zip(heatmap.regions, boxes):
        t = r.totals()
        per = f", {r.cell_pages} pages/cell" if r.cell_pages > 1 else ""
        band = box.top - GAP + 2          # the region's label line, above its cells
        _fit(lambda s, y=band, r=r: text(8, y, s, size=7, weight="bold" if r.traced else "normal"),
             renderer, r.label, GRID_X - 8 - 12)
        pages = f"{r.pages} page{'s' if r.pages != 1 else ''}{per}"
        detail = (f"{r.start:#x}  {pages}  not traced" if not r.traced else
                  f"{r.start:#x}  {pages}  not accessed" if not _accessed(r) else
                  f"{r.start:#x}  {pages}  L {t['loads']} S {t['stores']}"
                  + (f" B {t['block_events']}" if t["block_events"] else ""))
        _fit(lambda s, y=band: text(GRID_X, y + 1, s, size=6), renderer, detail,
             WIDTH - GRID_X - 8)
        for drawn, rows in box.folds:
            text(GRID_X - 6, box.top + drawn * CELL - 1, f"⋯ {rows} rows untouched", size=5.5,
                 ha="right", color="#556")
    text(GRID_X - 6, scale_y, "accesses per page (log)", size=7, ha="right")
    text(GRID_X, scale_y + 14, "1", size=6)
    text(GRID_X + steps, scale_y + 14, str(max(largest, 1)), size=6, ha="right")
    with writing(path):
        fig.savefig(path, dpi=DPI, format="png")
    return WIDTH, height


# ------------------------------------------------------------- bar charts
BAR_ROWS = 20


def bars(path: str, title: str, labels: list[str], series: list[tuple[str, list[int], str]],
          xlabel: str, stacked: bool) -> tuple[int, int]:
    """Horizontal bars, one row per label (top to bottom), one colour per series."""
    _colormaps, Figure, FigureCanvasAgg = _mpl()
    rows = max(len(labels), 1)
    width, height = 900, 90 + 22 * rows
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.32, 50 / height, 0.64, 1 - 90 / height))
    y = np.arange(rows)
    left = np.zeros(rows)
    thickness = 0.8 if stacked else 0.8 / len(series)
    for k, (name, counts, colour) in enumerate(series):
        values = np.array(counts + [0] * (rows - len(counts)), dtype=float)
        offset = 0 if stacked else (k - (len(series) - 1) / 2) * thickness
        ax.barh(y + offset, values, height=thickness, left=left if stacked else 0,
                color=colour, label=name)
        if stacked:
            left = left + values
    ax.set_yticks(y, [s if len(s) <= 44 else s[:43] + "…" for s in labels] or [""], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel, fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7, loc="lower right")
    fig.text(0.01, 1 - 8 / height, title, fontsize=10, weight="bold", va="top")
    with writing(path):
        fig.savefig(path, dpi=DPI, format="png")
    return width, height


def write_alloc_png(usage, path: str) -> tuple[int, int]:
    """Loads and stores per allocation site (the BAR_ROWS most accessed)."""
    sites = usage.sites[:BAR_ROWS]
    return bars(path, f"madtrace alloc of {usage.directory}: accesses per allocation site",
                 [s["site"] for s in sites],
                 [("loads", [s["loads"] for s in sites], "#4c72b0"),
                  ("stores", [s["stores"] for s in sites], "#dd8452")],
                 "accesses", stacked=True)


def write_footprint_png(report, path: str) -> tuple[int, int]:
    """Largest inclusive and exclusive byte footprint of a call, per function."""
    functions = report.function_rows()[:BAR_ROWS]
    return bars(path, f"madtrace footprint of {report.directory}: distinct bytes of the "
                       "largest call", [f["function"] for f in functions],
                 [("inclusive", [f["incl_bytes_max"] for f in functions], "#c44e52"),
                  ("own instructions", [f["self_bytes_max"] for f in functions], "#55a868")],
                 "distinct bytes", stacked=False)
