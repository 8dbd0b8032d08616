# SPDX-License-Identifier: GPL-2.0-or-later
"""PNG pictures of the memory analyses: misses per data for the cache, the
reuse distance histogram."""

from __future__ import annotations

from .png import BAR_ROWS, bars

LEVEL_COLOURS = ("#4c72b0", "#dd8452", "#c44e52", "#8172b3")


def write_cache_png(report, path: str) -> tuple[int, int]:
    """Misses per level of the data missed most (the BAR_ROWS first)."""
    d = report.to_dict()
    rows = d["by_data"][:BAR_ROWS]
    names = [lv["name"] for lv in d["levels"]]
    return bars(
        path,
        f"madtrace cache of {report.directory}: misses per data ({d['spec']})",
        [r["data"] for r in rows],
        [(f"{n} misses", [r["misses"][n] for r in rows], LEVEL_COLOURS[i % 4]) for i, n in enumerate(names)],
        "misses",
        stacked=False,
    )


def write_reuse_png(report, path: str) -> tuple[int, int]:
    """Uses per reuse distance bucket, and the cold (first) uses."""
    d = report.to_dict()
    labels = [d["buckets"][b] for b in range(len(d["histogram"]))] + ["cold"]
    return bars(
        path,
        f"madtrace reuse of {report.directory}: uses per distance ({d['line']}-byte lines)",
        labels,
        [("uses", d["histogram"] + [d["cold"]], "#4c72b0")],
        "uses",
        stacked=True,
    )
