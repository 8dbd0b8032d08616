# SPDX-License-Identifier: GPL-2.0-or-later
"""The HTML sections of the memory analyses (cache, sharing, reuse), made of
the page's tables (html.py)."""

from __future__ import annotations

from .html import cell, empty, heading, table
from .memory_text import level_table


def _rate(part: int, whole: int):
    return cell(f"{100.0 * part / whole:.1f}%", round(part / whole, 6)) if whole else None


def _miss_rows(rows: list[dict], names: list[str], first) -> list[list]:
    return [
        [
            *first(r),
            r["accesses"],
            *(r["misses"][n] for n in names),
            _rate(r["misses"][names[-1]], r["accesses"]),
        ]
        for r in rows
    ]


def cache_section(report) -> str:
    d = report.to_dict()
    names = [lv["name"] for lv in d["levels"]]
    source = "this machine's caches" if d["spec_from"] == "machine" else "--cache"
    out = [
        heading(
            "cache",
            "Simulated caches",
            f"{d['accesses']:,} accesses of {d['threads']} thread(s) through {d['spec']} "
            f"({source}; LRU, write-back, write-allocate). A level's misses include those of "
            "lines written back from the level above; the tables count the accesses' own.",
        )
    ]
    headers, rows = level_table(d, _rate)
    out.append(table(headers, rows, left=(0, 4), limit=0))
    miss_headers = ["accesses"] + [f"{n} misses" for n in names] + [f"{names[-1]} rate"]
    shade = tuple(range(2, 2 + len(names)))
    out.append(
        table(
            ["data", "region"] + miss_headers,
            _miss_rows(d["by_data"], names, lambda r: [r["data"], r["region"]]),
            left=(0, 1),
            caption="misses per data",
            shade=tuple(i + 1 for i in shade),
        )
    )
    if d["by_site"]:
        out.append(
            table(
                ["allocation site"] + miss_headers,
                _miss_rows(d["by_site"], names, lambda r: [r["site"]]),
                caption="misses per allocation site (its heap blocks together)",
                shade=shade,
            )
        )
    if d["by_function"]:
        out.append(
            table(
                ["function"] + miss_headers,
                _miss_rows(d["by_function"], names, lambda r: [r["function"]]),
                caption="misses per function (the innermost traced call)",
                shade=shade,
            )
        )
        out.append(
            table(
                ["call", "function", "tid"] + miss_headers,
                _miss_rows(d["by_call"], names, lambda r: [r["call_id"], r["function"], r["tid"]]),
                left=(1,),
                plain=(0, 2),
                caption="misses per call",
                shade=tuple(i + 2 for i in shade),
            )
        )
    out.append(
        table(
            ["source line"] + miss_headers,
            _miss_rows(
                d["by_line"],
                names,
                lambda r: [f"{r['file']}:{r['line']}" if r["file"] else f"{r['function']} (no line)"],
            ),
            caption="misses per source line",
            shade=shade,
        )
    )
    out.append(_annotated(d["by_line"], names))
    return "".join(out)


ANNOTATED_FILES = 3  # source files shown annotated with their misses
CONTEXT = 2  # lines shown around each line with accesses


def _annotated(by_line: list[dict], names: list[str]) -> str:
    """The source files with the most misses at the last level, each line with
    accesses annotated with them (and CONTEXT lines around)."""
    files: dict[str, dict[int, dict]] = {}
    for r in by_line:
        if r["file"]:
            files.setdefault(r["file"], {})[int(r["line"])] = r
    ranked = sorted(files, key=lambda f: (-sum(r["misses"][names[-1]] for r in files[f].values()), f))
    parts = []
    for path in ranked[:ANNOTATED_FILES]:
        lines = files[path]
        try:
            with open(path, errors="replace") as f:
                text = f.read().splitlines()
        except OSError:
            text = []
        shown = sorted(
            {
                n
                for line in lines
                for n in range(line - CONTEXT, line + CONTEXT + 1)
                if 1 <= n <= max(len(text), line)
            }
        )
        rows = []
        for n in shown:
            hit = lines.get(n)
            code = (text[n - 1] if n - 1 < len(text) else "").expandtabs(4)
            code = "\u00a0" * (len(code) - len(code.lstrip(" "))) + code.lstrip(" ")  # indentation kept
            rows.append(
                [n, code]
                + (
                    [hit["accesses"]] + [hit["misses"][m] for m in names]
                    if hit
                    else [None] * (1 + len(names))
                )
            )
        parts.append(
            table(
                ["line", "source", "accesses"] + [f"{m} misses" for m in names],
                rows,
                left=(1,),
                plain=(0,),
                caption=f"{path}: its lines with their misses",
                shade=tuple(range(3, 3 + len(names))),
                limit=0,
                cls="src",
            )
        )
    return "".join(parts)


def sharing_section(report) -> str:
    d = report.to_dict()
    out = [
        heading(
            "sharing",
            "Cache lines shared by threads",
            f"lines of {d['line']} bytes stored to by one thread and touched by another: "
            f"{d['false']} false sharing (the threads' bytes are disjoint), {d['true']} true."
            + (
                " The hybrid engine orders threads' accesses as it drained them: transfers "
                "count the changes between those batches."
                if d["interleaving"] == "drain"
                else ""
            ),
        )
    ]
    if len(d["threads"]) < 2:
        return out[0] + empty("One thread made every access: nothing is shared.")
    if not d["lines"]:
        return out[0] + empty("No cache line was stored to by one thread and touched by another.")
    rows = []
    for r in d["lines"]:
        for p in r["per_thread"]:
            rows.append(
                [
                    cell(f"{r['address']:#x}", r["address"]),
                    r["kind"],
                    r["transfers"],
                    p["tid"],
                    p["stores"],
                    p["loads"],
                    p["bytes"],
                    ", ".join(p["data"]),
                    ", ".join(p["functions"]),
                ]
            )
    out.append(
        table(
            ["line", "sharing", "transfers", "tid", "stores", "loads", "bytes", "data", "functions"],
            rows,
            left=(0, 1, 6, 7, 8),
            plain=(3,),
            shade=(2,),
        )
    )
    # the threads x data matrix of the shared lines: who stored what
    tids = d["threads"]
    matrix: dict[str, dict[int, int]] = {}
    for r in d["lines"]:
        for p in r["per_thread"]:
            for name in p["data"]:
                row = matrix.setdefault(name, {})
                row[p["tid"]] = row.get(p["tid"], 0) + p["stores"] + p["loads"]
    out.append(
        table(
            ["data"] + [f"thread {t}" for t in tids],
            [[name] + [row.get(t) for t in tids] for name, row in sorted(matrix.items())],
            caption="accesses to the shared lines, data x thread",
            shade=tuple(range(1, 1 + len(tids))),
        )
    )
    return "".join(out)


def reuse_section(report) -> str:
    d = report.to_dict()
    p = lambda v: "-" if v is None else f"<= {v}"
    out = [
        heading(
            "reuse",
            "Reuse distances",
            f"{d['uses']:,} uses of {d['line']}-byte lines, {d['cold']:,} first uses; half "
            f"the reuses at {p(d['p50'])} distinct lines in between, nine tenths at "
            f"{p(d['p90'])}: a cache of that many lines keeps them.",
        )
    ]
    out.append(
        table(
            ["distance (lines)", "uses"],
            [[d["buckets"][b], n] for b, n in enumerate(d["histogram"])] + [["cold", d["cold"]]],
            limit=0,
            shade=(1,),
            caption="all uses",
        )
    )
    for what, rows in (("data", d["by_data"]), ("function", d["by_function"])):
        if rows:
            extra = ["region"] if what == "data" else []
            out.append(
                table(
                    [what, *extra, "uses", "cold", "p50 distance", "p90 distance"],
                    [
                        [r[what], *(r[e] for e in extra), r["uses"], r["cold"], r["p50"], r["p90"]]
                        for r in rows
                    ],
                    left=tuple(range(1 + len(extra))),
                    caption=f"per {what}",
                )
            )
    return "".join(out)
