# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind source: accesses per source line (DWARF line tables); in
the HTML page, the annotated sources of every report of accesses."""

from __future__ import annotations

from . import Kind


def _compute(directory: str, args):
    from ..analysis.source_lines import source_lines

    return source_lines(directory)


def _part(directory: str, args):
    from ..analysis.source_lines import SourcePart

    return SourcePart(directory)


def _text(result, top: int, args, out) -> None:
    from ..report.text import print_source

    print_source(result, top, out)


def _html(result) -> str:
    from ..report.html import source_section

    return source_section(result)


KIND = Kind(
    name="source",
    help="accesses per source line",
    order=6,
    needs=("accesses",),
    compute=_compute,
    part=_part,
    text=_text,
    json=lambda result, args: result.to_dict(),
    html=_html,
    all_order=3,
    html_order=0,
    html_with_accesses=True,
)
