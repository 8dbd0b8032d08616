# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind sharing [--line N]: cache lines shared by threads, false and
true sharing, ranked by the transfers a coherent cache would make."""

from __future__ import annotations

from . import Kind


def _compute(directory: str, args):
    from ..analysis.sharing import sharing_report

    return sharing_report(directory, getattr(args, "line", None))


def _text(result, top: int, args, out) -> None:
    from ..report.memory_text import print_sharing

    print_sharing(result, top, out)


def _html(result) -> str:
    from ..report.memory_html import sharing_section

    return sharing_section(result)


KIND = Kind(
    name="sharing",
    help="cache lines shared by threads (false and true sharing)",
    order=9,
    needs=("accesses",),
    compute=_compute,
    text=_text,
    json=lambda result, args: result.to_dict(),
    html=_html,
    all_order=7,
    html_order=7,
)
