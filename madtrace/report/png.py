# SPDX-License-Identifier: GPL-2.0-or-later
"""PNG output: the page heat map (MadT's Fig. 1), drawn pixel-exact.

The grid is a numpy RGB image placed unscaled on a matplotlib figure (Agg
backend, no display needed) with the labels and the colour scale drawn as
text on top; ``layout(heatmap)`` gives where every region and cell is, so
a reader (and the tests) can find the cell of any page:

* width ``WIDTH`` px; a title band of ``TOP`` px, then the regions top
  (lowest address) to bottom, each ``rows * CELL`` px high plus ``GAP``;
  the colour scale in the last ``BOTTOM`` px;
* cell ``k`` of a region is at x = ``GRID_X + (k % COLUMNS) * CELL``,
  y = region top + ``(k // COLUMNS) * CELL``, ``CELL - 1`` px square;
* colours: untraced regions ``GREY``, traced pages never touched
  ``UNTOUCHED`` (pale blue), touched pages the ``YlOrRd`` colour map on a
  log scale from ``COLOR_LOW`` (1 access) to 1.0 (the largest cell).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..analysis.heatmap import COLUMNS, Heatmap
from ..errors import MadtraceError, writing

CELL = 8                      # px per cell, 1 px of it a gap
GRID_X = 330                  # left of the grid: the labels
WIDTH = GRID_X + COLUMNS * CELL + 16
TOP = 46
GAP = 14                      # between regions (a label line above each grid)
BOTTOM = 50
DPI = 100
GREY = (0.72, 0.72, 0.72)
UNTOUCHED = (0.90, 0.94, 1.0)
BACKGROUND = (1.0, 1.0, 1.0)
COLOR_LOW = 0.25
CMAP = "YlOrRd"


@dataclass
class RegionBox:
    top: int                  # y of the first row of cells
    rows: int


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


def layout(heatmap: Heatmap) -> tuple[list[RegionBox], int]:
    """The box of each region (in ``heatmap.regions`` order) and the image height."""
    boxes = []
    y = TOP
    for r in heatmap.regions:
        rows = max(1, -(-r.cells // COLUMNS))
        boxes.append(RegionBox(y + GAP, rows))
        y += GAP + rows * CELL
    return boxes, y + BOTTOM


def cell_origin(box: RegionBox, k: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of cell ``k`` of a region."""
    return GRID_X + (k % COLUMNS) * CELL, box.top + (k // COLUMNS) * CELL


def cell_colour(value: int, largest: int, cmap) -> tuple[float, float, float]:
    if value <= 0:
        return UNTOUCHED
    level = 1.0 if largest <= 1 else math.log(value) / math.log(largest)
    return tuple(cmap(COLOR_LOW + (1 - COLOR_LOW) * min(level, 1.0))[:3])


def _label(r) -> str:
    text = r.label if len(r.label) <= 40 else r.label[:39] + "…"
    return text


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
        for k in range(r.cells):
            colour = GREY if values is None else cell_colour(int(values[k]), largest, cmap)
            x, y = cell_origin(box, k)
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
        fig.text(x / WIDTH, 1 - y / height, s, fontsize=kw.pop("size", 7), va="top",
                 family="DejaVu Sans", **kw)

    d = heatmap.to_dict()
    text(8, 6, f"madtrace heat map of {heatmap.directory}", size=10, weight="bold")
    text(8, 24, f"{d['loads'] + d['stores']} accesses ({d['loads']} loads, {d['stores']} stores), "
                f"{d['block_events']} block events, {d['touched_pages']} pages touched; one cell "
                f"per page, low addresses at the top; grey: not traced", size=7)
    for r, box in zip(heatmap.regions, boxes):
        t = r.totals()
        per = f", {r.cell_pages} pages/cell" if r.cell_pages > 1 else ""
        text(8, box.top - 1, _label(r), size=7, weight="bold")
        pages = f"{r.pages} page{'s' if r.pages != 1 else ''}{per}"
        detail = (f"{r.start:#x}  {pages}  not traced" if not r.traced else
                  f"{r.start:#x}  {pages}  L {t['loads']} S {t['stores']}")
        text(GRID_X - 6, box.top - 1, detail, size=6, ha="right")
    text(GRID_X - 6, scale_y, "accesses per page (log)", size=7, ha="right")
    text(GRID_X, scale_y + 14, "1", size=6)
    text(GRID_X + steps, scale_y + 14, str(max(largest, 1)), size=6, ha="right")
    with writing(path):
        fig.savefig(path, dpi=DPI, format="png")
    return WIDTH, height


# ------------------------------------------------------------- bar charts
BAR_ROWS = 20


def _bars(path: str, title: str, labels: list[str], series: list[tuple[str, list[int], str]],
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
    return _bars(path, f"madtrace alloc of {usage.directory}: accesses per allocation site",
                 [s["site"] for s in sites],
                 [("loads", [s["loads"] for s in sites], "#4c72b0"),
                  ("stores", [s["stores"] for s in sites], "#dd8452")],
                 "accesses", stacked=True)


def write_footprint_png(report, path: str) -> tuple[int, int]:
    """Largest inclusive and exclusive byte footprint of a call, per function."""
    functions = report.function_rows()[:BAR_ROWS]
    return _bars(path, f"madtrace footprint of {report.directory}: distinct bytes of the "
                       "largest call", [f["function"] for f in functions],
                 [("inclusive", [f["incl_bytes_max"] for f in functions], "#c44e52"),
                  ("own instructions", [f["self_bytes_max"] for f in functions], "#55a868")],
                 "distinct bytes", stacked=False)
