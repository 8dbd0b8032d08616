# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind heatmap: accesses per page (MadT's Fig. 1)."""

from __future__ import annotations

from . import Kind


def _compute(directory: str, args):
    from ..analysis.heatmap import heatmap

    return heatmap(directory)


def _part(directory: str, args):
    from ..analysis.heatmap import HeatmapPart

    return HeatmapPart(directory)


def _text(result, top: int, args, out) -> None:
    from ..report.text import print_heatmap

    print_heatmap(result, out)


def _png(result, path: str):
    from ..report.png import write_heatmap_png

    return write_heatmap_png(result, path)


def _html(result) -> str:
    from ..report.html import heatmap_section

    return heatmap_section(result)


KIND = Kind(
    name="heatmap",
    help="accesses per page",
    order=2,
    needs=("accesses",),
    compute=_compute,
    part=_part,
    text=_text,
    json=lambda result, args: result.to_dict(),
    png=_png,
    html=_html,
    all_order=1,
    html_order=1,
)
