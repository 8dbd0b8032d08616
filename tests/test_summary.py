# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace summary's per-function data totals ("functions", self and
inclusive) and the readable summary at the end of `madtrace -- CMD`.

Oracles: valgrind lackey (accesses_self of a function that calls no library
code = the loads and stores its own instructions make), a naive
recomputation of the inclusive counts (an access counts for F when it lies
inside any call of F: the union of F's call intervals, so a recursion counts
once), and the recorder's own call counts."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from madtrace.binary.elf import ElfImage
from madtrace.trace.query import connect

from .oracles import lackey_accesses
from .test_data import sections
from .util import madtrace, prog, summary_json

# (program, variant, arguments, functions that make all their accesses with
# their own instructions: no library calls)
CASES = [("calls_longjmp", "O2-nopie", ["40"], ("dive", "after")),        # recursion, longjmp
         ("data_globals", "O0-nopie", [], ("fill", "sum", "count_vowels", "move_points"))]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    base = tmp_path_factory.mktemp("summary")
    out = {}
    for program, variant, args, _ in CASES:
        directory = base / program
        result = madtrace("record", "-q", "--data", "-o", str(directory), "--",
                          prog(program, variant), *args, timeout=300)
        assert result.returncode == 0, result.stderr.decode()
        out[program] = str(directory)
    return out


@pytest.mark.parametrize("program,variant,args,own", CASES)
def test_accesses_self_equal_lackey(traces, program, variant, args, own):
    path = prog(program, variant)
    functions = summary_json(traces[program])["functions"]
    image = ElfImage.load(path)
    text = image.section(".text")
    oracle = lackey_accesses([path, *args], (text.address, text.address + text.size),
                             sections(path, ".data", ".bss"))
    per_function = collections.Counter()
    for (address, _kind), n in oracle.items():
        symbol = image.symbol_at(address)
        per_function[symbol.name if symbol else None] += n
    for name in own:
        assert functions[name]["accesses_self"] == per_function[name] > 0, name


def naive_inclusive(directory: str) -> dict[str, tuple[int, int]]:
    """{function: (accesses, bytes)} made while a call of it was open: for each
    thread, mark the accesses inside any of its calls' (begin_pos, end_pos)."""
    con = connect(directory)
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    tids = [t for (t,) in con.execute("SELECT DISTINCT tid FROM calls").fetchall()]
    for tid in tids:
        acc = con.execute("SELECT pos, size FROM accesses WHERE tid = ? ORDER BY pos",
                          [tid]).fetchnumpy()
        pos, size = acc["pos"], acc["size"].astype(np.int64)
        calls = con.execute("SELECT function::VARCHAR, begin_pos, end_pos FROM calls "
                            "WHERE tid = ? AND fate <> 'unmatched'", [tid]).fetchall()
        by_function = collections.defaultdict(list)
        for name, begin, end in calls:
            by_function[name].append((begin, end))
        for name, spans in by_function.items():
            inside = np.zeros(len(pos), dtype=bool)
            for begin, end in spans:
                lo = np.searchsorted(pos, begin, side="right")
                hi = np.searchsorted(pos, end, side="left")
                inside[lo:hi] = True
            out[name][0] += int(inside.sum())
            out[name][1] += int(size[inside].sum())
    return {k: tuple(v) for k, v in out.items()}


@pytest.mark.parametrize("program", [c[0] for c in CASES])
def test_inclusive_totals_equal_a_naive_recomputation(traces, program):
    summary = summary_json(traces[program])
    functions = summary["functions"]
    naive = naive_inclusive(traces[program])
    assert {k: (f["accesses_incl"], f["bytes_incl"]) for k, f in functions.items()} == naive
    # calls are the recorder's counts; self never exceeds inclusive
    assert {k: f["calls"] for k, f in functions.items()} == \
        {k: n for k, n in summary["calls"].items() if n}
    for f in functions.values():
        assert f["accesses_self"] <= f["accesses_incl"] and f["bytes_self"] <= f["bytes_incl"]
    total = sum(c["L"] + c["S"] for c in summary["accesses"].values())
    outermost = [f for k, f in functions.items() if k == "main"]
    assert outermost and outermost[0]["accesses_incl"] <= total
    if program == "calls_longjmp":
        # dive recurses: its inclusive count holds its nested calls' accesses once
        assert functions["dive"]["accesses_incl"] > functions["dive"]["accesses_self"]


def test_run_ends_with_a_readable_summary(tmp_path):
    result = madtrace("-q", "--data", "-o", str(tmp_path / "t"), "--",
                      prog("data_heap", "O0-nopie"), timeout=300)
    assert result.returncode == 0
    text = result.stderr.decode()
    for needle in ("top functions by accesses", "build_list  self", "top variables:",
                   "top heap blocks:", "<malloc00", "dropped events: 0"):
        assert needle in text, needle
    functions = summary_json(tmp_path / "t")["functions"]
    line = [x for x in text.splitlines() if x.strip().startswith("build_list  self")][0]
    assert line.split()[2] == str(functions["build_list"]["accesses_self"])


def test_accesses_per_region_and_module(traces):
    """summary's regions: every access in exactly one region; the program's own
    .data and .bss counts equal the raw access records classified by the
    sections' bounds (readelf's, through ElfImage); modules add their regions up."""
    import os
    from madtrace.trace.events import load_accesses
    path = prog("data_globals", "O0-nopie")
    summary = summary_json(traces["data_globals"])
    regions = {r["region"]: r for r in summary["regions"]}
    total = sum(c["L"] + c["S"] for c in summary["accesses"].values())
    assert sum(r["loads"] + r["stores"] for r in regions.values()) == total
    rows = np.concatenate(list(load_accesses(traces["data_globals"]).values()))
    name = os.path.basename(path)
    for section in (".data", ".bss"):
        (lo, hi), = sections(path, section)
        mine = rows[(rows["addr"] >= lo) & (rows["addr"] < hi)]
        got = regions[f"{section} of {name}"]
        assert (got["loads"], got["stores"]) == (int((mine["kind"] == 1).sum()),
                                                 int((mine["kind"] == 2).sum()))
        assert got["loads"] + got["stores"] > 0 and got["module"] == name
    module = summary["accesses_by_module"][name]
    assert module["loads"] == sum(r["loads"] for r in regions.values() if r["module"] == name)


def test_a_binary_changed_since_the_recording_is_refused(tmp_path):
    """meta.json keeps each module's build-id: once the program is rebuilt (another
    binary at the same path) the trace's addresses would be named from other code,
    so every reader refuses it in one line (exit 28); the recorded binary put back,
    it reads again."""
    import shutil
    from .util import one_line_error
    program = tmp_path / "prog"
    shutil.copy(prog("data_globals", "O2-pie"), program)
    directory = str(tmp_path / "t")
    r = madtrace("record", "-q", "--data", "-o", directory, "--", str(program))
    assert r.returncode == 0, r.stderr.decode()
    before = summary_json(directory)
    assert [m["build_id"] for m in before["modules"].values() if m["main"]][0]
    shutil.copy(prog("data_globals", "O0-pie"), program)
    for command in (["summary", directory], ["report", directory, "--kind", "heatmap"],
                    ["report", directory, "--kind", "cache"]):
        one_line_error(madtrace(*command), 28, "changed since")
    shutil.copy(prog("data_globals", "O2-pie"), program)
    assert summary_json(directory) == before
