# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace diff A B: two traces of one program compared.

Oracles: each trace's own numbers as the other commands report them: the
per-function calls and accesses of ``summary --json``, the times of ``report
--kind calls --json``, the regions and variables of the summary, the
allocation sites of ``report --kind alloc --json`` and the cache simulation's
``report --kind cache --json``; the diff's A and B are those numbers and its
change their difference.  A trace compared with itself changes nothing;
traces of different programs, or with and without data accesses, are one
line and exit code 27.

tests/progs/list_walk builds a list of N malloc'd nodes at one allocation
site and walks it PASSES times with traverse(): N and PASSES change the
calls, the accesses and the heap blocks."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from madtrace.analysis.diff import compare_cache, heap_key
from madtrace.errors import CorruptTraceError, NotComparableError
from madtrace.kinds import KINDS

from .util import madtrace, one_line_error, prog, report_json, summary_json

RUNS = {
    "a": ("list_walk", ["40", "1"], True),
    "b": ("list_walk", ["70", "3"], True),
    "unwalked": ("list_walk", ["40", "0"], True),  # traverse() never called
    "plain": ("list_walk", ["40", "1"], False),  # no data accesses
    "other": ("data_calls", ["10"], True),
}  # another program
SPEC = "L1=4K:4:64,L2=64K:8:64"


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    base = tmp_path_factory.mktemp("diff")
    out = {}
    for key, (program, args, data) in RUNS.items():
        directory = str(base / key)
        result = madtrace(
            "record",
            "-q",
            *(["--data"] if data else []),
            "-o",
            directory,
            "--",
            prog(program, "O0-pie"),
            *args,
        )
        assert result.returncode == 0, result.stderr.decode()
        out[key] = directory
    return out


def diff_json(a: str, b: str, *args: str) -> dict:
    result = madtrace("diff", a, b, "--json", *args)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def diff_ab(traces):
    return diff_json(traces["a"], traces["b"])


@pytest.fixture(scope="module")
def summaries(traces):
    return {key: summary_json(traces[key]) for key in ("a", "b")}


def check_change(c: dict, a, b) -> None:
    assert (c["a"], c["b"]) == (a, b)
    assert c["delta"] == pytest.approx((b or 0) - (a or 0), abs=1e-6)
    assert c["pct"] == (round(100.0 * c["delta"] / a, 1) if a else None)


def test_functions_are_the_differences_of_the_summaries_and_call_reports(traces, diff_ab, summaries):
    rows = {r["name"]: r for r in diff_ab["functions"]}
    names = set(summaries["a"]["functions"]) | set(summaries["b"]["functions"])
    assert set(rows) == names and {"main", "traverse"} <= names
    calls = {key: report_json(traces[key], "--kind", "calls")["functions"] for key in ("a", "b")}
    for name in names:
        fa, fb = summaries["a"]["functions"][name], summaries["b"]["functions"][name]
        check_change(rows[name]["calls"], fa["calls"], fb["calls"])
        check_change(rows[name]["accesses"], fa["accesses_self"], fb["accesses_self"])
        check_change(rows[name]["bytes"], fa["bytes_self"], fb["bytes_self"])
        check_change(rows[name]["incl_ns"], calls["a"][name]["incl_ns"], calls["b"][name]["incl_ns"])
        check_change(rows[name]["excl_ns"], calls["a"][name]["excl_ns"], calls["b"][name]["excl_ns"])
    # one call of traverse() per pass, one load of a node's value and next per node each
    assert rows["traverse"]["calls"]["delta"] == 3 - 1
    assert rows["traverse"]["accesses"]["delta"] == 70 * 3 * 2 - 40 * 1 * 2
    assert diff_ab["timed"] and diff_ab["totals"]["calls"]["a"] == sum(
        f["calls"] for f in summaries["a"]["functions"].values()
    )


def test_data_are_the_differences_of_the_summaries(diff_ab, summaries):
    rows = diff_ab["data"]
    variables = {r["name"]: r for r in rows if r["type"] == "variable"}
    tops = {key: {v["name"]: v for v in summaries[key]["top_variables"]} for key in ("a", "b")}
    common = set(tops["a"]) & set(tops["b"])
    assert common
    for name in common:
        check_change(variables[name]["accesses"], tops["a"][name]["accesses"], tops["b"][name]["accesses"])
        check_change(variables[name]["bytes"], tops["a"][name]["bytes"], tops["b"][name]["bytes"])
    # variables, heap sites and the rest of each region add up to the summary's regions
    for side in ("a", "b"):
        per_region: Counter = Counter()
        bytes_per_region: Counter = Counter()
        for r in rows:
            per_region[r["region"]] += r["accesses"][side] or 0
            bytes_per_region[r["region"]] += r["bytes"][side] or 0
        expected = {g["region"]: g["loads"] + g["stores"] for g in summaries[side]["regions"]}
        assert {k: v for k, v in per_region.items() if v} == expected
        assert {k: v for k, v in bytes_per_region.items() if v} == {
            g["region"]: g["bytes"] for g in summaries[side]["regions"]
        }
        assert diff_ab["totals"]["accesses"][side] == sum(expected.values())
    # heap blocks match by allocation site, whatever their ids
    assert all("@" in r["name"] and r["name"] == heap_key(r["name"]) for r in rows if r["type"] == "heap")


def test_alloc_sites_are_the_differences_of_the_alloc_reports(traces, diff_ab):
    alloc = {key: report_json(traces[key], "--kind", "alloc") for key in ("a", "b")}
    rows = {r["site"]: r for r in diff_ab["alloc_sites"]}
    heap: dict[str, Counter] = defaultdict(Counter)
    for r in diff_ab["data"]:
        if r["type"] == "heap":
            for side in ("a", "b"):
                heap[r["name"].split("@", 1)[1][:-1]][side] += r["accesses"][side] or 0
    for side in ("a", "b"):
        sites = {s["site"]: s for s in alloc[side]["sites"]}
        assert {site for site, r in rows.items() if r["blocks"][side] is not None} == set(sites)
        for site, s in sites.items():
            r = rows[site]
            assert (r["blocks"][side], r["bytes_allocated"][side], r["accesses"][side], r["bytes"][side]) == (
                s["blocks"],
                s["bytes_allocated"],
                s["loads"] + s["stores"],
                s["bytes"],
            )
            assert heap[site][side] == s["loads"] + s["stores"]
        assert diff_ab["totals"]["blocks"][side] == alloc[side]["totals"]["blocks"]
        assert diff_ab["totals"]["bytes_allocated"][side] == alloc[side]["totals"]["bytes_allocated"]
    nodes = max(diff_ab["alloc_sites"], key=lambda r: abs(r["blocks"]["delta"]))
    assert nodes["blocks"]["delta"] == 70 - 40 and nodes["kinds"] == ["malloc"]
    assert nodes is diff_ab["alloc_sites"][0]  # ranked by the change in blocks


def test_a_trace_compared_with_itself_changes_nothing(traces):
    same = diff_json(traces["a"], traces["a"])
    for table in ("functions", "data", "alloc_sites"):
        assert same[table]
        for row in same[table]:
            assert row["status"] == "same", row
            assert all(c["delta"] == 0 for k, c in row.items() if isinstance(c, dict))
    assert all(c["delta"] == 0 for c in same["totals"].values())
    text = madtrace("diff", traces["a"], traces["a"]).stdout.decode()
    assert " changed" not in text and "no change: functions by calls" in text


def test_rows_of_one_trace_only_are_new_or_gone(traces):
    gone = {r["name"]: r for r in diff_json(traces["a"], traces["unwalked"])["functions"]}
    assert gone["traverse"]["status"] == "gone"
    assert gone["traverse"]["calls"] == {"a": 1, "b": None, "delta": -1, "pct": -100.0}
    assert gone["main"]["status"] == "changed"
    new = {r["name"]: r for r in diff_json(traces["unwalked"], traces["a"])["functions"]}
    assert new["traverse"]["status"] == "new"
    assert new["traverse"]["calls"] == {"a": None, "b": 1, "delta": 1, "pct": None}
    text = madtrace("diff", traces["unwalked"], traces["a"]).stdout.decode()
    assert any(
        line.split()[0] == "traverse" and line.split()[-1] == "new"
        for line in text.splitlines()
        if line.strip()
    )


def test_text_lists_the_largest_changes_first_top_rows_per_table(traces, diff_ab):
    result = madtrace("diff", traces["a"], traces["b"], "--top", "1")
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    changed = [r for r in diff_ab["data"] if r["accesses"]["delta"]]
    largest = max(changed, key=lambda r: abs(r["accesses"]["delta"]))
    at = lines.index(f"   data by accesses: {len(changed)} of {len(diff_ab['data'])} changed")
    assert lines[at + 2].strip().startswith(largest["name"])
    assert lines[at + 2].split()[-2:] == [
        f"{largest['accesses']['delta']:+d}",
        f"{largest['accesses']['pct']:+.1f}%",
    ]
    assert lines[at + 3].startswith(f"     … {len(changed) - 1} more")
    assert madtrace("diff", traces["a"], traces["b"], "--top", "0").returncode == 2


def test_json_shape(diff_ab):
    assert diff_ab["kind"] == "diff"
    assert set(diff_ab) >= {
        "a",
        "b",
        "timed",
        "accesses",
        "totals",
        "functions",
        "data",
        "alloc_sites",
        "cache",
    }
    assert diff_ab["cache"] is None
    assert diff_ab["a"]["program"] == diff_ab["b"]["program"] == "list_walk-O0-pie"
    for table, measures in (
        ("functions", ("calls", "incl_ns", "excl_ns", "accesses", "bytes")),
        ("data", ("accesses", "bytes")),
        ("alloc_sites", ("blocks", "bytes_allocated", "accesses", "bytes")),
    ):
        for row in diff_ab[table]:
            assert row["status"] in ("new", "gone", "changed", "same")
            for m in measures:
                assert set(row[m]) == {"a", "b", "delta", "pct"}
        first = [abs(r[measures[0]]["delta"]) for r in diff_ab[table]]
        assert first == sorted(first, reverse=True)
    assert {r["type"] for r in diff_ab["data"]} == {"variable", "heap", "region"}


def test_traces_that_do_not_compare_are_one_line_errors(traces, tmp_path):
    code = NotComparableError.exit_code
    assert code == 27
    one_line_error(madtrace("diff", traces["a"], traces["other"]), code, "data_calls-O0-pie")
    one_line_error(madtrace("diff", traces["a"], traces["plain"]), code, "has data accesses")
    one_line_error(madtrace("diff", traces["plain"], traces["a"]), code, "has data accesses")
    one_line_error(
        madtrace("diff", traces["a"], str(tmp_path)),
        CorruptTraceError.exit_code,
        "not a madtrace trace directory",
    )
    plain = madtrace("diff", traces["plain"], traces["plain"])  # calls only: no data tables
    assert plain.returncode == 0 and "data not compared" in plain.stdout.decode()


def test_cache_comparison_matches_heap_blocks_by_site():
    def doc(blocks):
        return {
            "levels": [
                {
                    "name": "L1",
                    "size": 4096,
                    "ways": 4,
                    "line": 64,
                    "accesses": 100,
                    "misses": 10 * len(blocks),
                    "load_misses": 5,
                    "store_misses": 5,
                }
            ],
            "by_data": [
                {"data": f"<malloc{i:04d}@main+107>", "region": "[heap]", "accesses": 10, "misses": {"L1": 3}}
                for i in blocks
            ]
            + [{"data": "counters[2]", "region": ".bss of p", "accesses": 4, "misses": {"L1": 1}}],
        }

    diff = compare_cache(doc([1, 2]), doc([7, 8, 9]))
    level = diff["levels"][0]
    assert (level["name"], level["size"], level["misses"]["delta"]) == ("L1", 4096, 10)
    rows = {r["data"]: r for r in diff["by_data"]}
    assert set(rows) == {"<malloc@main+107>", "counters[2]"}
    heap = rows["<malloc@main+107>"]
    assert heap["misses"]["L1"] == {"a": 6, "b": 9, "delta": 3, "pct": 50.0}
    assert heap["accesses"]["delta"] == 10 and rows["counters[2]"]["status"] == "same"
    assert heap_key("<freed:0003@main+107>") == "<freed@main+107>"


@pytest.mark.skipif(
    "cache" not in KINDS,
    reason="the cache report kind (report --kind cache) "
    "is not part of this madtrace: diff --cache compares its JSON",
)
def test_cache_misses_are_the_differences_of_the_cache_reports(traces):
    diff = diff_json(traces["a"], traces["b"], "--cache", SPEC)["cache"]
    reports = {key: report_json(traces[key], "--kind", "cache", "--cache", SPEC) for key in ("a", "b")}
    levels = {r["name"]: r for r in diff["levels"]}
    assert list(levels) == ["L1", "L2"]
    for side in ("a", "b"):
        for level in reports[side]["levels"]:
            for m in ("misses", "accesses", "load_misses", "store_misses"):
                assert levels[level["name"]][m][side] == level[m]
        expected: dict[str, Counter] = defaultdict(Counter)
        for row in reports[side]["by_data"]:
            for name, n in row["misses"].items():
                expected[heap_key(row["data"])][name] += n
        present = [r for r in diff["by_data"] if r["status"] != ("new" if side == "a" else "gone")]
        got = {r["data"]: {n: c[side] for n, c in r["misses"].items()} for r in present}
        assert got == {k: dict(v) for k, v in expected.items()}
    # without a spec: the machine's caches; with no data accesses: refused
    assert diff_json(traces["a"], traces["a"], "--cache")["cache"]["levels"]
    result = madtrace("diff", traces["plain"], traces["plain"], "--cache")
    one_line_error(result, 24, "--cache needs data accesses")
