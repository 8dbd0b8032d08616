# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind cache [--cache SPEC]: a simulated cache hierarchy, its misses
per data, function, call and source line."""

from __future__ import annotations

from . import Kind


def _compute(directory: str, args):
    from ..analysis.cache import cache_report

    return cache_report(directory, getattr(args, "cache", None))


def _part(directory: str, args):
    from ..analysis.cache import cache_part

    return cache_part(directory, getattr(args, "cache", None))


def _text(result, top: int, args, out) -> None:
    from ..report.memory_text import print_cache

    print_cache(result, top, out)


def _png(result, path: str):
    from ..report.memory_png import write_cache_png

    return write_cache_png(result, path)


def _html(result) -> str:
    from ..report.memory_html import cache_section

    return cache_section(result)


KIND = Kind(
    name="cache",
    help="simulated cache misses per data, function, call and line",
    order=8,
    needs=("accesses",),
    compute=_compute,
    part=_part,
    text=_text,
    json=lambda result, args: result.to_dict(),
    png=_png,
    html=_html,
    all_order=6,
    html_order=6,
)
