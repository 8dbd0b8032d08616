# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind reuse [--line N]: reuse distance histograms per data and per
function."""

from __future__ import annotations

from . import Kind


def _compute(directory: str, args):
    from ..analysis.reuse import reuse_report

    return reuse_report(directory, getattr(args, "line", None))


def _part(directory: str, args):
    from ..analysis.reuse import ReusePart

    return ReusePart(directory, getattr(args, "line", None))


def _text(result, top: int, args, out) -> None:
    from ..report.memory_text import print_reuse

    print_reuse(result, top, out)


def _png(result, path: str):
    from ..report.memory_png import write_reuse_png

    return write_reuse_png(result, path)


def _html(result) -> str:
    from ..report.memory_html import reuse_section

    return reuse_section(result)


KIND = Kind(
    name="reuse",
    help="reuse distances per data and function",
    order=10,
    needs=("accesses",),
    compute=_compute,
    part=_part,
    text=_text,
    json=lambda result, args: result.to_dict(),
    png=_png,
    html=_html,
    all_order=8,
    html_order=8,
)
