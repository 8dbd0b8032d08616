# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind footprint: distinct bytes, lines and pages per call and function."""

from __future__ import annotations

from . import Kind


def _compute(directory: str, args):
    from ..analysis.footprint import DEFAULT_TOP_CALLS, footprint

    return footprint(directory, top=max(args.top or 0, DEFAULT_TOP_CALLS))


def _text(result, top: int, args, out) -> None:
    from ..report.text import print_footprint

    print_footprint(result, top, out)


def _png(result, path: str):
    from ..report.png import write_footprint_png

    return write_footprint_png(result, path)


def _html(result) -> str:
    from ..report.html import footprint_section

    return footprint_section(result)


KIND = Kind(
    name="footprint",
    help="distinct bytes/lines/pages per call and function",
    order=5,
    needs=("calls", "accesses"),
    compute=_compute,
    text=_text,
    json=lambda result, args: result.to_dict(),
    png=_png,
    html=_html,
    all_order=5,
    html_order=4,
)
