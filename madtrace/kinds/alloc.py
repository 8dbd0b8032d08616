# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind alloc: heap blocks and allocation sites."""

from __future__ import annotations

from . import Kind


def _compute(directory: str, args):
    from ..analysis.alloc_usage import alloc_usage

    return alloc_usage(directory)


def _part(directory: str, args):
    from ..analysis.alloc_usage import AllocPart

    return AllocPart(directory)


def _text(result, top: int, args, out) -> None:
    from ..report.text import print_alloc

    print_alloc(result, top, out)


def _png(result, path: str):
    from ..report.png import write_alloc_png

    return write_alloc_png(result, path)


def _html(result) -> str:
    from ..report.html import alloc_section

    return alloc_section(result)


KIND = Kind(
    name="alloc",
    help="heap blocks and allocation sites",
    order=3,
    needs=("accesses",),
    compute=_compute,
    part=_part,
    text=_text,
    json=lambda result, args: result.to_dict(),
    png=_png,
    html=_html,
    all_order=2,
    html_order=2,
)
