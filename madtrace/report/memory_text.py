# SPDX-License-Identifier: GPL-2.0-or-later
"""Text output of the memory analyses (cache, sharing, reuse)."""

from __future__ import annotations

from .text import more_rows, table


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _miss_table(
    rows: list[dict], key, names: list[str], top: int, out, what: str, extra: tuple[str, ...] = ()
) -> None:
    headers = [what, *extra, "accesses"] + [f"{n} misses" for n in names] + [f"{names[-1]} rate"]
    cells = [
        [
            key(r),
            *(r.get(e, "") for e in extra),
            r["accesses"],
            *(r["misses"][n] for n in names),
            _pct(r["misses"][names[-1]], r["accesses"]),
        ]
        for r in rows[:top]
    ]
    table(headers, cells, out, left=tuple(range(1 + len(extra))))
    more_rows(rows, top, what, out)


LEVEL_HEADERS = (
    "level",
    "bytes",
    "ways",
    "line",
    "kept",
    "lookups",
    "misses",
    "load misses",
    "store misses",
    "write-back misses",
    "write-backs",
    "invalidations",
    "miss rate",
)


def level_table(d: dict, rate) -> tuple[list[str], list[list]]:
    """The cache report's table of levels (``d``: its JSON): headers and rows,
    the miss rate made by ``rate(misses, lookups)``."""
    rows = [
        [
            lv["name"],
            lv["size"],
            lv["ways"],
            lv["line"],
            "shared" if lv["shared"] else "per thread",
            lv["accesses"],
            lv["misses"],
            lv["load_misses"],
            lv["store_misses"],
            lv["writeback_misses"],
            lv["writebacks"],
            lv["invalidations"],
            rate(lv["misses"], lv["accesses"]),
        ]
        for lv in d["levels"]
    ]
    return list(LEVEL_HEADERS), rows


def print_cache(report, top: int, out) -> None:
    d = report.to_dict()
    names = [lv["name"] for lv in d["levels"]]
    source = "this machine's caches" if d["spec_from"] == "machine" else "--cache"
    print(f"== madtrace cache of {report.directory}", file=out)
    print(
        f"   {d['accesses']} accesses of {d['threads']} thread(s) through {d['spec']} "
        f"({source}; LRU, write-back, write-allocate)",
        file=out,
    )
    headers, rows = level_table(d, lambda part, whole: _pct(part, whole))
    table(headers, rows, out, left=(0, 4))
    print("\n== misses per data", file=out)
    _miss_table(d["by_data"], lambda r: r["data"], names, top, out, "data", ("region",))
    if d["by_site"]:
        print("\n== misses per allocation site (its heap blocks together)", file=out)
        _miss_table(d["by_site"], lambda r: r["site"], names, top, out, "site")
    if d["by_function"]:
        print("\n== misses per function (the innermost traced call)", file=out)
        _miss_table(d["by_function"], lambda r: r["function"], names, top, out, "function")
        print("\n== misses per call", file=out)
        _miss_table(
            d["by_call"], lambda r: f"{r['function']} #{r['call_id']}", names, top, out, "call", ("tid",)
        )
    print("\n== misses per source line", file=out)
    _miss_table(
        d["by_line"],
        lambda r: f"{r['file']}:{r['line']}" if r["file"] else f"{r['function']} (no line)",
        names,
        top,
        out,
        "line",
    )


def print_sharing(report, top: int, out) -> None:
    d = report.to_dict()
    print(f"== madtrace sharing of {report.directory}", file=out)
    if len(d["threads"]) < 2:
        print("   one thread made every access: nothing is shared", file=out)
        return
    print(
        f"   {len(d['lines'])} cache lines of {d['line']} bytes stored to by one thread and "
        f"touched by another ({d['false']} false sharing, {d['true']} true); transfers: the "
        "times a coherent cache moves the line between threads",
        file=out,
    )
    if d["interleaving"] == "drain":
        print(
            "   the hybrid engine orders threads' accesses as it drained them, not as they ran: "
            "transfers count the changes between those batches (real runs alternate more "
            "often); --data-engine fault orders them exactly",
            file=out,
        )
    if not d["lines"]:
        return
    rows = []
    for r in d["lines"][:top]:
        for i, p in enumerate(r["per_thread"]):
            rows.append(
                [
                    f"{r['address']:#x}" if i == 0 else "",
                    r["kind"] if i == 0 else "",
                    r["transfers"] if i == 0 else "",
                    p["tid"],
                    p["stores"],
                    p["loads"],
                    p["bytes"],
                    ", ".join(p["data"]),
                    ", ".join(p["functions"]),
                ]
            )
    table(
        ["line", "sharing", "transfers", "tid", "stores", "loads", "bytes", "data", "functions"],
        rows,
        out,
        left=(0, 1, 6, 7, 8),
    )
    more_rows(d["lines"], top, "lines", out)


def _distance(value) -> str:
    return "-" if value is None else f"<= {value}"


def print_reuse(report, top: int, out) -> None:
    d = report.to_dict()
    print(f"== madtrace reuse of {report.directory}", file=out)
    print(
        f"   {d['uses']} uses of {d['line']}-byte lines, {d['cold']} first uses; half the "
        f"reuses at a distance {_distance(d['p50'])} lines, nine tenths {_distance(d['p90'])} "
        "(distinct lines the thread used in between)",
        file=out,
    )
    hist = d["histogram"]
    if hist:
        largest = max(hist)
        rows = [
            [d["buckets"][b], n, "#" * max(1 if n else 0, round(40 * n / largest))]
            for b, n in enumerate(hist)
        ]
        rows.append(["cold", d["cold"], ""])
        table(["distance", "uses", ""], rows, out, left=(0, 2))
    for what, rows_of in (("data", d["by_data"]), ("function", d["by_function"])):
        if not rows_of:
            continue
        print(f"\n== reuse per {what}", file=out)
        extra = ("region",) if what == "data" else ()
        table(
            [what, *extra, "uses", "cold", "p50 distance", "p90 distance"],
            [
                [
                    r[what],
                    *(r[e] for e in extra),
                    r["uses"],
                    r["cold"],
                    _distance(r["p50"]),
                    _distance(r["p90"]),
                ]
                for r in rows_of[:top]
            ],
            out,
            left=tuple(range(1 + len(extra))),
        )
        more_rows(rows_of, top, what, out)
