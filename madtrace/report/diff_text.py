# SPDX-License-Identifier: GPL-2.0-or-later
"""Text output of ``madtrace diff A B``: the totals, then one table per measure
(functions by calls, by time, by accesses; data by accesses, by bytes;
allocation sites by blocks, bytes allocated, accesses; cache misses per level
and per data), each listing the rows that changed, the largest absolute change
first, ``top`` rows per table.  Renders analysis/diff.py's JSON value."""

from __future__ import annotations

from .text import table

# (what the rows are, the diff's list, its measure, what it is by, how a value is shown)
NS, COUNT = "ns", "count"
TABLES = (
    ("functions", "functions", "calls", "calls", COUNT),
    ("functions", "functions", "incl_ns", "inclusive time (ms)", NS),
    ("functions", "functions", "excl_ns", "exclusive time (ms)", NS),
    ("functions", "functions", "accesses", "accesses (self: as the innermost traced call)", COUNT),
    ("data", "data", "accesses", "accesses", COUNT),
    ("data", "data", "bytes", "bytes accessed", COUNT),
    ("allocation sites", "alloc_sites", "blocks", "blocks", COUNT),
    ("allocation sites", "alloc_sites", "bytes_allocated", "bytes allocated", COUNT),
    ("allocation sites", "alloc_sites", "accesses", "accesses", COUNT),
)
TOTALS = (
    ("calls", "calls", COUNT),
    ("accesses", "accesses", COUNT),
    ("bytes accessed", "bytes", COUNT),
    ("heap blocks", "blocks", COUNT),
    ("bytes allocated", "bytes_allocated", COUNT),
    ("duration (s)", "duration_s", "s"),
)


def value(v, unit: str) -> str:
    if v is None:
        return "-"
    if unit == NS:
        return f"{v / 1e6:.3f}"
    if unit == "s":
        return f"{v:.3f}"
    return str(v)


def signed(v, unit: str) -> str:
    if unit == NS:
        return f"{v / 1e6:+.3f}"
    if unit == "s":
        return f"{v:+.3f}"
    return f"{v:+d}"


def percent(c: dict, status: str | None = None) -> str:
    if status in ("new", "gone"):
        return status
    if not c["delta"]:
        return ""
    if c["pct"] is None:
        return "from 0"
    return f"{c['pct']:+.1f}%"


def label_of(row: dict) -> str:
    if "site" in row:
        return f"{row['site']} ({','.join(row['kinds'])})"
    if "data" in row:
        return row["data"]
    if row.get("type") == "variable":
        return f"{row['name']} [{row['region']}]"
    if row.get("type") == "region":
        return f"{row['name']} (no variable, no heap block)"
    return row["name"]


def print_table(title: str, rows: list[tuple[dict, dict | None]], unit: str, top: int, out) -> bool:
    """``rows``: (row, its change in the measure or None: not measured); those that
    changed, the largest absolute change first.  False (nothing printed): none did."""
    measured = [(r, c) for r, c in rows if c is not None]
    changed = sorted(
        ((r, c) for r, c in measured if c["delta"]), key=lambda rc: (-abs(rc[1]["delta"]), label_of(rc[0]))
    )
    if not changed:
        return False
    print(f"\n   {title}: {len(changed)} of {len(measured)} changed", file=out)
    table(
        ["", "A", "B", "change", "%"],
        [
            [
                label_of(r),
                value(c["a"], unit),
                value(c["b"], unit),
                signed(c["delta"], unit),
                percent(c, r["status"]),
            ]
            for r, c in changed[:top]
        ],
        out,
        indent="     ",
    )
    if len(changed) > top:
        print(f"     … {len(changed) - top} more (raise --top, or --json for all)", file=out)
    return True


def side_line(s: dict) -> str:
    command = " ".join(s.get("command") or []) or f"pid {s.get('pid')}"
    if s.get("exit_status") is not None:
        ending = f"exit status {s['exit_status']}"
    else:
        ending = str(s.get("outcome") or "")
    return f"{command} ({ending})"


def print_diff(diff: dict, top: int, out) -> None:
    a, b = diff["a"], diff["b"]
    print(f"== madtrace diff {a['directory']} {b['directory']}", file=out)
    print(f"   A: {side_line(a)}", file=out)
    print(f"   B: {side_line(b)}", file=out)
    if a["calls"] and not diff["timed"]:
        untimed = " and ".join(n for n, s in (("A", a), ("B", b)) if not s["timed"])
        print(f"   time not compared: {untimed} recorded without time stamps (--no-time)", file=out)
    if not diff["accesses"]:
        print("   data not compared: neither trace has data accesses (record with --data)", file=out)
    totals = diff["totals"]
    print("", file=out)
    table(
        ["totals", "A", "B", "change", "%"],
        [
            [
                name,
                value(totals[key]["a"], unit),
                value(totals[key]["b"], unit),
                signed(totals[key]["delta"], unit),
                percent(totals[key]),
            ]
            for name, key, unit in TOTALS
            if key in totals
        ],
        out,
    )
    unchanged: dict[str, list[str]] = {}
    for what, key, measure, by, unit in TABLES:
        rows = [(row, row.get(measure)) for row in diff[key]]
        if any(c is not None for _, c in rows) and not print_table(f"{what} by {by}", rows, unit, top, out):
            unchanged.setdefault(what, []).append(by.split(" (")[0])
    cache = diff.get("cache")
    if cache:
        for level in print_cache(cache, top, out):
            unchanged.setdefault("data", []).append(f"{level} misses")
    if unchanged:
        print(
            "\n   no change: " + "; ".join(f"{what} by {', '.join(by)}" for what, by in unchanged.items()),
            file=out,
        )


def size(n) -> str:
    """A cache's size as its spec gives it: 48K, 2M..."""
    if not isinstance(n, int) or n <= 0:
        return f"{n} B"
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n} B"


def print_cache(cache: dict, top: int, out) -> list[str]:
    """The simulated misses per level, then the data by misses of each level;
    the levels whose data tables did not change."""
    levels = cache["levels"]
    print("\n   cache misses per level (simulated):", file=out)
    rows = []
    for level in levels:
        m = level.get("misses")
        if m is None:
            continue
        geometry = f"{size(level.get('size'))}, {level.get('ways')} ways, {level.get('line')} B lines"
        rows.append(
            [
                f"{level['name']} ({geometry})",
                value(m["a"], COUNT),
                value(m["b"], COUNT),
                signed(m["delta"], COUNT),
                percent(m, level["status"]),
            ]
        )
    table(["", "A", "B", "change", "%"], rows, out, indent="     ")
    unchanged = []
    for level in levels:
        name = level["name"]
        data = [(row, row["misses"].get(name)) for row in cache["by_data"]]
        if not print_table(f"data by {name} misses", data, COUNT, top, out):
            unchanged.append(name)
    return unchanged
