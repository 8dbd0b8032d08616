# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind numa: local, remote and unpinned accesses (NUMAPROF's metrics)."""

from __future__ import annotations

from . import Kind


def _compute(directory: str, args):
    from ..analysis.numa import numa_report

    return numa_report(directory, _topology(args))


def _part(directory: str, args):
    from ..analysis.numa import NumaPart

    return NumaPart(directory, _topology(args))


def _topology(args):
    from ..analysis.numa import load_topology

    return load_topology(args.topology) if args.topology else None


def _text(result, top: int, args, out) -> None:
    from ..report.text import print_numa

    print_numa(result, top, out)


def _html(result) -> str:
    from ..report.html import numa_section

    return numa_section(result)


KIND = Kind(
    name="numa",
    help="local/remote/unpinned accesses",
    order=4,
    needs=("accesses", "numa"),
    compute=_compute,
    part=_part,
    text=_text,
    json=lambda result, args: result.to_dict(),
    html=_html,
    all_order=4,
    html_order=3,
)
