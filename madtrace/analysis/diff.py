# SPDX-License-Identifier: GPL-2.0-or-later
"""Two traces of one program compared (``madtrace diff A B``).

Each trace is read as the summary reads it, from the raw capture and without
the store (trace/access_counts.py: one pass that segments the calls and
names the accesses), plus the call tree (calltree.py) for the times when both
traces have time stamps:

* per function: calls, inclusive and exclusive time (ns), accesses and bytes
  made while it was the innermost traced call (self);
* per data: accesses (loads + stores) and bytes of each variable (by symbol,
  as the summary names them), of each heap allocation site and of what is
  neither, per region (``[stack]``, ``[heap]`` outside tracked blocks...).  A
  heap block's forged name carries a block id that differs between runs
  (``<malloc0014@fill+33>``): blocks are matched by allocator and allocation
  site (``<malloc@fill+33>``), their counts summed;
* per allocation site (the alloc report's: ``func+off`` of the allocator's
  caller; the malloc inside a C++ ``new`` is the ``new`` block's, not counted
  again): blocks, bytes allocated, accesses and bytes accessed;
* optionally per cache level and per data, the misses of the cache
  simulation (the ``cache`` report kind's JSON, computed by the caller:
  :func:`compare_cache`).

Each value is compared as ``{"a", "b", "delta", "pct"}`` (``pct``: the change
relative to A in percent, None when A has none); a row present in one trace
only is ``new`` (B only) or ``gone`` (A only), its missing side None.  Rows
are ranked by the absolute change of their table's first measure.

Two traces are not comparable (NotComparableError) when they ran different
programs (the main executable's name: the names of regions and variables
carry it) or when one has data accesses, or call records, that the other
lacks.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ..errors import NotComparableError
from ..trace.access_counts import access_totals
from ..trace.blocks import load_block_table
from ..trace.format import FUNCTIONS_FILE
from ..trace.meta import read_meta
from ..trace.record_files import ACCESS_RECORDS, CALL_RECORDS
from ..trace.segmentation import load_tables

# the measures of each table, the first one ranks its rows
FUNCTION_MEASURES = ("calls", "incl_ns", "excl_ns", "accesses", "bytes")
DATA_MEASURES = ("accesses", "bytes")
SITE_MEASURES = ("blocks", "bytes_allocated", "accesses", "bytes")
LEVEL_MEASURES = ("misses", "accesses", "load_misses", "store_misses")
TOTAL_MEASURES = ("calls", "accesses", "bytes", "blocks", "bytes_allocated", "duration_s")

# <malloc0014@fill+33>, <freed:0014@fill+33>, <unmap:0003@main+20>: block_name()'s forms
_BLOCK_NAME = re.compile(r"^<(?P<kind>.+?)(?P<id>\d+)@(?P<site>.+)>$")


def heap_key(name: str) -> str:
    """A heap block's name without its block id (``<malloc@fill+33>``): the same
    allocator and allocation site in two runs; any other name as it is."""
    match = _BLOCK_NAME.match(name)
    if match is None:
        return name
    kind = match["kind"].rstrip(":")
    return f"<{kind}@{match['site']}>"


# ---------------------------------------------------------------- one trace
@dataclass
class TraceInfo:
    """What tells whether two traces compare: read from meta.json and the file
    names, no pass over the records."""

    directory: str
    meta: dict
    program: str | None  # the main executable's name
    has_calls: bool
    has_accesses: bool
    timed: bool  # call records with time stamps


def program_of(meta: dict) -> str | None:
    """The main executable's name: its module's, else the command's first word."""
    for module in meta.get("modules") or []:
        if isinstance(module, dict) and module.get("main") and module.get("name"):
            return str(module["name"])
    command = meta.get("command") or []
    return os.path.basename(str(command[0])) if command else None


def trace_info(directory: str) -> TraceInfo:
    """CorruptTraceError (read_meta's) for a directory that is not a trace."""
    meta = read_meta(directory)
    has_calls = bool(CALL_RECORDS.files(directory)) or os.path.exists(os.path.join(directory, FUNCTIONS_FILE))
    has_accesses = "data_tracing" in meta or bool(ACCESS_RECORDS.files(directory))
    timed = False
    if has_calls:
        tables = load_tables(directory, required=False)
        timed = tables.timestamps and tables.tsc_hz is not None
    return TraceInfo(directory, meta, program_of(meta), has_calls, has_accesses, timed)


def check_comparable(a: TraceInfo, b: TraceInfo) -> None:
    """NotComparableError unless A and B are traces of one program recorded
    with the same kinds of records."""
    if a.program is not None and b.program is not None and a.program != b.program:
        raise NotComparableError(
            f"{a.directory} is a trace of {a.program}, {b.directory} of {b.program}: a diff "
            "compares two traces of the same program"
        )
    for what, option, have in (
        ("data accesses", "with --data", (a.has_accesses, b.has_accesses)),
        ("call records", "without --no-functions", (a.has_calls, b.has_calls)),
    ):
        if have[0] != have[1]:
            with_it, without = (a, b) if have[0] else (b, a)
            raise NotComparableError(
                f"{with_it.directory} has {what}, {without.directory} has none: record both "
                f"{option} to compare them"
            )


@dataclass
class TraceTotals:
    """One trace's measures, keyed as the diff matches them."""

    info: TraceInfo
    functions: dict[str, dict] = field(default_factory=dict)
    data: dict[tuple[str, str], dict] = field(default_factory=dict)  # (type, name): values
    sites: dict[str, dict] = field(default_factory=dict)
    totals: dict = field(default_factory=dict)


def trace_totals(info: TraceInfo, timed: bool) -> TraceTotals:
    """The measures of one trace (``timed``: with the call tree's times)."""
    directory = info.directory
    out = TraceTotals(info)
    totals = access_totals(directory)
    for name, f in totals.functions.items():
        out.functions[name] = {"calls": f["calls"]}
        if info.has_accesses:
            out.functions[name].update(accesses=f["accesses_self"], bytes=f["bytes_self"])
    if timed:
        from .calltree import analyze_calls

        analysis = analyze_calls(directory)
        for name, f in analysis.functions.items():
            if name in out.functions:
                out.functions[name].update(incl_ns=f["incl_ns"], excl_ns=f["excl_ns"])
    table = load_block_table(directory)
    n_blocks = len(table)
    # per block id: accesses, bytes (index 0: none)
    block_accesses = np.zeros(n_blocks + 1, dtype=np.int64)
    block_bytes = np.zeros(n_blocks + 1, dtype=np.int64)
    d, counts = totals.data, totals.counts
    for i, (symbol, region, block) in enumerate(
        zip(d.get("symbol", []), d.get("region", []), d.get("block", []))
    ):
        loads, stores, size, _after_free = (int(v) for v in counts[i])
        if 0 < block <= n_blocks:
            row = table.rows[block - 1]
            key = ("heap", f"<{table.kinds[int(row['kind'])]}@{table.sites[int(row['site'])]}>")
            block_accesses[block] += loads + stores
            block_bytes[block] += size
        elif symbol is not None:
            key = ("variable", str(symbol))
        else:
            key = ("region", str(region))
        entry = out.data.setdefault(key, {"region": region, "accesses": 0, "bytes": 0})
        entry["accesses"] += loads + stores
        entry["bytes"] += size
    rows = table.rows
    for i in range(n_blocks):
        if int(rows[i]["part_of"]):
            continue  # the malloc inside a `new`: the `new` block's bytes
        site = table.sites[int(rows[i]["site"])]
        kind = table.kinds[int(rows[i]["kind"])]
        s = out.sites.setdefault(
            site, {"kinds": [], "blocks": 0, "bytes_allocated": 0, "accesses": 0, "bytes": 0}
        )
        if kind not in s["kinds"]:
            s["kinds"].append(kind)
        s["blocks"] += 1
        s["bytes_allocated"] += int(rows[i]["size"])
        s["accesses"] += int(block_accesses[i + 1])  # block id i + 1 (load_block_table)
        s["bytes"] += int(block_bytes[i + 1])
    meta = info.meta
    duration = (
        round(meta["end_time"] - meta["start_time"], 6)
        if "end_time" in meta and "start_time" in meta
        else None
    )
    out.totals = {
        "calls": sum(f["calls"] for f in out.functions.values()) if info.has_calls else None,
        "accesses": sum(e["accesses"] for e in out.data.values()) if info.has_accesses else None,
        "bytes": sum(e["bytes"] for e in out.data.values()) if info.has_accesses else None,
        "blocks": n_blocks if info.has_accesses else None,
        "bytes_allocated": sum(s["bytes_allocated"] for s in out.sites.values())
        if info.has_accesses
        else None,
        "duration_s": duration,
    }
    return out


# ---------------------------------------------------------------- compare
def change(a, b) -> dict:
    """A measure in A and in B (None: not there) compared."""
    delta = (b or 0) - (a or 0)
    if isinstance(delta, float):
        delta = round(delta, 6)  # ns to 0.1, seconds to 1 µs: no float noise
    pct = round(100.0 * delta / a, 1) if a else None
    return {"a": a, "b": b, "delta": delta, "pct": pct}


def compare_rows(a: dict, b: dict, measures: Iterable[str], label: Callable[[Any, dict], dict]) -> list[dict]:
    """One row per key of A or B: ``label(key, its values)`` plus each measure
    (see change(); a measure neither side has is left out) and ``status``:
    new, gone, changed or same.  Ranked by the absolute change of the first
    measure, then of the others, then by the label's values."""
    measures = tuple(measures)
    rows = []
    for key in set(a) | set(b):
        ra, rb = a.get(key), b.get(key)
        row = label(key, ra if ra is not None else rb or {})
        for m in measures:
            va = None if ra is None else ra.get(m)
            vb = None if rb is None else rb.get(m)
            if va is None and vb is None:
                continue  # not measured (no time stamps)
            row[m] = change(va, vb)
        if ra is None:
            row["status"] = "new"
        elif rb is None:
            row["status"] = "gone"
        else:
            row["status"] = "changed" if any(row[m]["delta"] for m in measures if m in row) else "same"
        rows.append(row)
    rows.sort(
        key=lambda r: (
            [-abs(r[m]["delta"]) if m in r else 0 for m in measures],
            [str(v) for k, v in r.items() if k not in measures],
        )
    )
    return rows


def diff_traces(a: TraceInfo, b: TraceInfo, cache: tuple[dict, dict] | None = None) -> dict:
    """The diff of two traces (check_comparable() first) as one JSON value;
    ``cache``: the cache kind's JSON of A and of B, compared (compare_cache)."""
    timed = a.timed and b.timed
    ta, tb = trace_totals(a, timed), trace_totals(b, timed)
    functions = compare_rows(ta.functions, tb.functions, FUNCTION_MEASURES, lambda key, _v: {"name": key})
    data = compare_rows(
        ta.data,
        tb.data,
        DATA_MEASURES,
        lambda key, v: {"name": key[1], "type": key[0], "region": v["region"]},
    )
    sites = compare_rows(ta.sites, tb.sites, SITE_MEASURES, lambda key, v: {"site": key, "kinds": v["kinds"]})
    totals = {
        m: change(ta.totals[m], tb.totals[m])
        for m in TOTAL_MEASURES
        if ta.totals[m] is not None or tb.totals[m] is not None
    }
    return {
        "kind": "diff",
        "a": side(ta),
        "b": side(tb),
        "timed": timed,
        "accesses": a.has_accesses and b.has_accesses,
        "totals": totals,
        "functions": functions,
        "data": data,
        "alloc_sites": sites,
        "cache": None if cache is None else compare_cache(*cache),
    }


def side(t: TraceTotals) -> dict:
    meta = t.info.meta
    return {
        "directory": t.info.directory,
        "program": t.info.program,
        "command": meta.get("command"),
        "pid": meta.get("pid"),
        "outcome": meta.get("outcome"),
        "exit_status": meta.get("exit_status"),
        "calls": t.info.has_calls,
        "timed": t.info.timed,
        "accesses": t.info.has_accesses,
    }


# ------------------------------------------------------------------ cache
def compare_cache(a: dict, b: dict) -> dict:
    """The cache kind's JSON of A and of B compared: per level its misses,
    accesses, load and store misses; per data (heap blocks by allocation
    site: heap_key) its accesses and misses per level."""

    def levels(doc: dict) -> dict:
        return {str(level["name"]): level for level in doc.get("levels") or []}

    def by_data(doc: dict) -> dict:
        out: dict[str, dict] = {}
        for row in doc.get("by_data") or []:
            entry = out.setdefault(heap_key(str(row["data"])), {"region": row.get("region"), "accesses": 0})
            entry["accesses"] += int(row.get("accesses") or 0)
            for level, n in (row.get("misses") or {}).items():
                entry[f"misses:{level}"] = entry.get(f"misses:{level}", 0) + int(n or 0)
        return out

    la, lb = levels(a), levels(b)
    names = list(la) + [n for n in lb if n not in la]
    level_rows = compare_rows(
        la,
        lb,
        LEVEL_MEASURES,
        lambda key, v: {"name": key, **{k: v.get(k) for k in ("size", "ways", "line")}},
    )
    order = {name: i for i, name in enumerate(names)}
    level_rows.sort(key=lambda r: order[r["name"]])  # L1, L2... as simulated
    da, db = by_data(a), by_data(b)
    measures = [f"misses:{n}" for n in names] + ["accesses"]
    data_rows = compare_rows(da, db, measures, lambda key, v: {"data": key, "region": v["region"]})
    for row in data_rows:
        row["misses"] = {name: row.pop(f"misses:{name}") for name in names if f"misses:{name}" in row}
    return {"levels": level_rows, "by_data": data_rows}
