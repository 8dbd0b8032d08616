# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind segments: each call with its accesses (a text listing)."""

from __future__ import annotations

from . import Kind


def _compute(directory: str, args):
    from ..analysis.segments import segments

    return segments(
        directory,
        max_accesses=args.top or 8,
        max_lines=400 if args.depth is None else max(args.depth, 1) * 50,
    )


def _text(lines, top: int, args, out) -> None:
    for line in lines:
        print(line, file=out)


KIND = Kind(
    name="segments",
    help="each call with its accesses",
    order=1,
    needs=("calls",),
    compute=_compute,
    text=_text,
    text_only="--kind segments is a text listing (its data: madtrace export, madtrace query)",
)
