# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind calls: per-function counts and times, and the call tree."""

from __future__ import annotations

from . import Kind


def _compute(directory: str, args):
    from ..analysis.calltree import analyze_calls

    return analyze_calls(directory)


def _text(result, top: int, args, out) -> None:
    from ..report.calls_text import DEFAULT_DEPTH, print_human_report

    print_human_report(result, top, DEFAULT_DEPTH if args.depth is None else args.depth, out)


def _json(result, args) -> dict:
    from ..report.calls_text import report_dict

    return report_dict(result, args.top, args.depth)


def _html(result) -> str:
    from ..report.html import calls_section

    return calls_section(result)


KIND = Kind(
    name="calls",
    help="per-function counts and times, call tree",
    order=0,
    needs=("calls",),
    compute=_compute,
    text=_text,
    json=_json,
    html=_html,
    all_order=0,
    html_order=5,
    default_top=10,
)
