# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace report: the dynamic calls rebuilt from the records are exact.

Contract exercised:
  madtrace record -q -o DIR [--no-time] -- PROG ARGS
  madtrace report DIR [--json] [--top N] [--depth D]
  madtrace.analysis.calltree.analyze_calls(DIR, chunk_records=, max_nodes=)

Oracles: ``madtrace summary --json`` (the per-site entry counts of the
recorder), the program's own "calls: NAME=COUNT" line (calls_longjmp: every
dive and bail frame is abandoned by longjmp), the structure of the programs
(fib(20) from main...) and, for the stack rules that the test programs do not
reach (tail sites, attach, rsp wrap), hand-written record files.
"""

from __future__ import annotations

import json
import os
import shutil
from functools import lru_cache

import numpy as np
import pytest

from madtrace.analysis import calltree
from madtrace.errors import CorruptTraceError
from madtrace.trace.record_files import CALL_RECORDS
from madtrace.trace.format import RECORD_DTYPE

from .util import VARIANTS, madtrace, one_line_error, prog, report_json, summary_json

PROGRAMS = ("calls_recursion", "calls_longjmp", "calls_tail", "calls_threads")
TIME_FIELDS = ("incl_ns", "excl_ns")


# ----------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """recorded(name, variant, *options): record build/tests/NAME-VARIANT once
    per module; returns (trace directory, the program's stdout)."""
    base = tmp_path_factory.mktemp("report")

    @lru_cache(maxsize=None)
    def record(name: str, variant: str, *options: str) -> tuple[str, str]:
        out = str(base / f"{name}-{variant}{''.join(options)}")
        result = madtrace("record", "-q", "-o", out, *options, "--", prog(name, variant))
        assert result.returncode == 0, result.stderr
        return out, result.stdout.decode()
    return record


def summary_calls(directory: str) -> dict:
    return summary_json(directory)["calls"]


def program_counts(stdout: str) -> dict[str, int]:
    line = [line for line in stdout.splitlines() if line.startswith("calls: ")][-1]
    return {k: int(v) for k, v in (item.split("=") for item in line[len("calls: "):].split())}


# entry-patched functions that are the outermost frame of their thread: a lost
# exit record only leaves them open at the end, it changes no other frame
OUTERMOST = ("main", "thread_main")


def entry_exits_missing(directory: str) -> bool:
    """True when entry-patched functions (but the outermost ones) wrote fewer
    exit records than entry records (the programs this is asked about return
    from every call: the exit stub of the injector did not emit)."""
    with open(os.path.join(directory, "functions.json")) as f:
        sites = json.load(f)["sites"]
    entry_sids = np.array([s["sid"] for s in sites
                           if s["kind"] == "entry" and s["function"] not in OUTERMOST],
                          dtype=np.int64)
    if not len(entry_sids):
        return False
    entered = exited = 0
    for _, path in CALL_RECORDS.files(directory):
        codes = CALL_RECORDS.read(path)["code"].astype(np.int64)
        is_entry_site = np.isin(codes >> 1, entry_sids)
        entered += int(np.count_nonzero(is_entry_site & (codes & 1 == 0)))
        exited += int(np.count_nonzero(is_entry_site & (codes & 1 == 1)))
    return exited < entered


def assert_entry_exits_present(directory: str) -> None:
    """Entry-patched functions must write their exit records (their exit stubs
    once lost the control block pointer and silently wrote none)."""
    assert not entry_exits_missing(directory), "entry-patched functions wrote no exit record"


def child(node: dict, name: str) -> dict:
    matches = [c for c in node["children"] if c["name"] == name]
    assert len(matches) == 1, (name, [c["name"] for c in node["children"]])
    return matches[0]


def without_times(tree: dict) -> dict:
    """{path of names: (calls, completed, unwound, open)} (iterative: deep trees)."""
    flat, pending = {}, [((), tree)]
    while pending:
        path, node = pending.pop()
        flat[path] = (node["calls"], node["completed"], node["unwound"], node["open"])
        pending.extend((path + (c["name"],), c) for c in node["children"])
    return flat


# ------------------------------------------------------- real traces: counts
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", PROGRAMS)
def test_report_calls_equal_summary_calls(recorded, name, variant):
    directory, stdout = recorded(name, variant)
    report = report_json(directory)
    functions = report["functions"]
    assert {k: f["calls"] for k, f in functions.items()} == summary_calls(directory)
    for key, count in program_counts(stdout).items():
        assert functions[key]["calls"] == count, key
    for key, f in functions.items():
        assert f["completed"] + f["unwound"] + f["open"] == f["calls"], (key, f)
    counters = report["counters"]
    assert counters["entries"] == sum(f["calls"] for f in functions.values())
    assert counters["records"] == counters["entries"] + counters["exits"]
    assert counters["unmatched_exits"] == 0
    assert counters["tree_truncated"] is False
    # the tree holds every call exactly once
    pending, tree_calls = list(report["tree"]["children"]), 0
    while pending:
        node = pending.pop()
        tree_calls += node["calls"]
        pending.extend(node["children"])
    assert tree_calls == counters["entries"]
    if name != "calls_longjmp":
        assert_entry_exits_present(directory)
        assert counters["unwound_frames"] == 0
        for key, f in functions.items():
            assert f["completed"] + f["open"] == f["calls"], (key, f)


@pytest.mark.parametrize("variant", VARIANTS)
def test_longjmp_unwound_frames_are_the_abandoned_ones(recorded, variant):
    directory, stdout = recorded("calls_longjmp", variant)
    own = program_counts(stdout)
    report = report_json(directory)
    functions, counters = report["functions"], report["counters"]
    # every dive and bail frame is left by longjmp; attempt and after return
    assert counters["unwound_frames"] == own["dive"] + own["bail"] > 0
    assert functions["dive"]["unwound"] == own["dive"]
    assert functions["bail"]["unwound"] == own["bail"]
    assert functions["attempt"]["completed"] == own["attempt"]
    assert functions["after"]["completed"] == own["after"]
    assert functions["attempt"]["unwound"] == functions["after"]["unwound"] == 0
    # after() is called from attempt() (never from an abandoned dive frame) and main()
    attempt = child(child(report["tree"], "main"), "attempt")
    assert child(attempt, "after")["calls"] + child(child(report["tree"], "main"),
                                                    "after")["calls"] == own["after"]
    assert child(attempt, "dive")["calls"] == own["attempt"]
    assert functions["dive"]["max_recursion"] == 13      # dive(0) .. dive(12)
    assert functions["attempt"]["incl_ns"] >= functions["dive"]["incl_ns"] > 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_recursion_tree_and_times(recorded, variant):
    directory, _ = recorded("calls_recursion", variant)
    assert_entry_exits_present(directory)   # is_even/is_odd are entry-patched at -O2
    report = report_json(directory)
    fib = report["functions"]["fib"]
    assert fib["calls"] == 21891
    assert fib["incl_ns"] >= fib["excl_ns"] > 0
    assert fib["max_recursion"] == 20
    assert report["functions"]["depth_sum"]["max_recursion"] == 501
    root = report["tree"]
    assert [c["name"] for c in root["children"]] == ["main"]
    main = child(root, "main")
    assert sorted(c["name"] for c in main["children"]) == ["depth_sum", "fib", "is_even", "is_odd"]
    top_fib = child(main, "fib")
    assert top_fib["calls"] == 1
    assert child(top_fib, "fib")["calls"] == 2          # fib(19) and fib(18)
    assert child(child(top_fib, "fib"), "fib")["calls"] == 4
    assert child(main, "is_even")["calls"] == child(main, "is_odd")["calls"] == 1
    assert child(main, "depth_sum")["calls"] == 1
    # inclusive time of a node covers its children
    for node in (main, top_fib):
        assert node["incl_ns"] >= sum(c["incl_ns"] for c in node["children"])
        assert node["excl_ns"] == pytest.approx(
            node["incl_ns"] - sum(c["incl_ns"] for c in node["children"]), abs=1.0)
    assert main["incl_ns"] >= fib["incl_ns"]


@pytest.mark.parametrize("name", ["calls_recursion", "calls_longjmp", "calls_threads"])
def test_no_time_gives_null_times_and_the_same_tree(recorded, name):
    timed, _ = recorded(name, "O2-pie")
    untimed, _ = recorded(name, "O2-pie", "--no-time")
    a, b = report_json(timed), report_json(untimed)
    assert b["timestamps"] is False
    for f in b["functions"].values():
        assert f["incl_ns"] is None and f["excl_ns"] is None
    pending = [b["tree"]]
    while pending:
        node = pending.pop()
        assert node["incl_ns"] is None and node["excl_ns"] is None
        pending.extend(node["children"])
    assert {k: {x: v for x, v in f.items() if x not in TIME_FIELDS}
            for k, f in b["functions"].items()} == \
        {k: {x: v for x, v in f.items() if x not in TIME_FIELDS} for k, f in a["functions"].items()}
    assert without_times(a["tree"]) == without_times(b["tree"])
    assert b["counters"]["span_ns"] is None


def test_threads_are_merged_and_counted(recorded):
    directory, _ = recorded("calls_threads", "O0-pie")
    report = report_json(directory)
    assert report["counters"]["threads"] == len(report["threads"]) == 5
    assert sum(t["records"] for t in report["threads"].values()) == report["counters"]["records"]
    root = report["tree"]
    assert root["calls"] == 5
    thread_main = child(root, "thread_main")
    assert thread_main["calls"] == 4
    # thread k calls work() 3000*k times, main 3000 times
    assert child(thread_main, "work")["calls"] == 3000 * (1 + 2 + 3 + 4)
    assert child(child(root, "main"), "work")["calls"] == 3000


def test_chunking_and_tree_cap_keep_counts_exact(recorded):
    directory, _ = recorded("calls_recursion", "O0-pie")
    whole = calltree.analyze_calls(directory)
    chunked = calltree.analyze_calls(directory, chunk_records=7)
    assert chunked.functions == whole.functions
    assert chunked.counters == whole.counters
    capped = calltree.analyze_calls(directory, max_nodes=30)
    assert capped.counters["tree_truncated"] is True
    assert capped.counters["tree_nodes"] == 30
    assert capped.counters["truncated_calls"] > 0
    for key, f in whole.functions.items():
        assert capped.functions[key]["calls"] == f["calls"]
        assert capped.functions[key]["excl_ns"] == pytest.approx(f["excl_ns"], abs=1.0)


# ------------------------------------------------------------- human report
def test_human_report_lists_functions_and_tree(recorded):
    directory, _ = recorded("calls_recursion", "O0-pie")
    result = madtrace("report", directory, "--depth", "3", "--top", "2")
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode()
    for name in ("fib", "main"):   # the heaviest (the rest depends on timing with --top 2)
        assert name in text
    assert "call tree" in text
    lines = text.splitlines()
    tree_lines = lines[[i for i, line in enumerate(lines) if "call tree" in line][0] + 1:]
    assert tree_lines[0].strip().startswith("main  calls=1")
    # main's children are ordered by inclusive time, which the machine's load can
    # reorder between light ones: look for fib among them, and fib's own child below it
    indents = [len(line) - len(line.lstrip()) for line in tree_lines]
    children = [i for i in range(1, len(tree_lines)) if indents[i] == indents[1]]
    assert indents[1] > indents[0]
    fib = [i for i in children if tree_lines[i].strip().startswith("fib  calls=1")]
    assert fib, tree_lines
    assert tree_lines[fib[0] + 1].strip().startswith("fib  calls=2")
    assert indents[fib[0] + 1] > indents[fib[0]]
    assert any(line.strip().startswith("…") for line in tree_lines)
    assert "more functions" in text          # --top 2 of 6 functions


def test_human_report_without_time(recorded):
    directory, _ = recorded("calls_recursion", "O2-pie", "--no-time")
    result = madtrace("report", directory)
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode()
    assert "timestamps no" in text and "fib" in text and "% calls" in text


# ------------------------------------------------------------ corrupt input
def _copy(directory: str, tmp_path) -> str:
    target = str(tmp_path / "copy")
    shutil.copytree(directory, target)
    return target


def test_rec_file_cut_short_is_read_up_to_the_cut(recorded, tmp_path):
    directory = _copy(recorded("calls_recursion", "O2-pie")[0], tmp_path)
    shutil.rmtree(os.path.join(directory, "store"), ignore_errors=True)
    (_, path), = CALL_RECORDS.files(directory)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3)
    result = madtrace("report", directory)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.decode().splitlines() if "truncated at offset" in line]
    assert len(warned) == 1 and warned[0].startswith(f"madtrace: {path}: "), result.stderr


def test_unknown_site_code_is_corrupt(recorded, tmp_path):
    directory = _copy(recorded("calls_recursion", "O2-pie")[0], tmp_path)
    (_, path), = CALL_RECORDS.files(directory)
    records = CALL_RECORDS.read(path)
    records["code"][5] = 4000 << 1
    CALL_RECORDS.write(path, records)
    one_line_error(madtrace("report", directory, "--json"), 18, "record 5")


def test_missing_functions_json_is_corrupt(recorded, tmp_path):
    directory = _copy(recorded("calls_recursion", "O2-pie")[0], tmp_path)
    os.unlink(os.path.join(directory, "functions.json"))
    one_line_error(madtrace("report", directory), 18, "functions.json")
    one_line_error(madtrace("report", str(tmp_path / "nothing")), 18, "nothing")


def test_kind_is_a_choice(recorded):
    directory, _ = recorded("calls_recursion", "O2-pie")
    result = madtrace("report", directory, "--kind", "accesses")
    assert result.returncode == 2 and b"invalid choice" in result.stderr


# ------------------------------------------- stack rules on written records
SITES = [  # sid: function, kind
    ("main", "entry"), ("a", "call"), ("b", "call"), ("t", "tail"), ("e", "entry"), ("c", "call")]


def write_trace(tmp_path, records: list[tuple[int, str, bool, int]], timestamps=True) -> str:
    """records: (tsc, function of the site, is_exit, rsp); one thread."""
    directory = tmp_path / "trace"
    (directory / "calls").mkdir(parents=True)
    sites = [{"sid": i, "function": f, "kind": k, "address": 0x1000 + i, "caller": None}
             for i, (f, k) in enumerate(SITES)]
    functions = [{"fid": i, "name": n, "module": "m", "address": 0, "size": 1,
                  "method": "entry" if n in ("main", "e") else "callsite", "reason": ""}
                 for i, n in enumerate(["main", "a", "b", "t", "e", "c"])]
    doc = {"timestamps": timestamps, "tsc_hz": 1e9 if timestamps else None, "sites": sites,
           "functions": functions, "report": {}}
    (directory / "functions.json").write_text(json.dumps(doc))
    sid_of = {f: i for i, (f, _) in enumerate(SITES)}
    array = np.array([(tsc, (sid_of[f] << 1) | int(is_exit), rsp & 0xFFFFFFFF)
                      for tsc, f, is_exit, rsp in records], dtype=RECORD_DTYPE)
    CALL_RECORDS.write(str(directory / "calls" / "100.rec"), array)
    return str(directory)


def E(tsc, f, rsp):
    return (tsc, f, False, rsp)


def X(tsc, f, rsp):
    return (tsc, f, True, rsp)


def test_tail_frames_end_with_their_enclosing_frame(tmp_path):
    # main calls a; a tail-jumps to t (same rsp), t tail-jumps to t again, t calls c;
    # a's exit closes a and both t frames
    directory = write_trace(tmp_path, [
        E(0, "main", 1000), E(10, "a", 900), E(20, "t", 900), E(30, "t", 900),
        E(40, "c", 800), X(50, "c", 800), X(70, "a", 900), X(100, "main", 1000)])
    result = calltree.analyze_calls(directory)
    f = result.functions
    assert f["t"]["calls"] == f["t"]["completed"] == 2 and f["t"]["unwound"] == 0
    assert f["a"]["completed"] == 1 and f["a"]["incl_ns"] == 60
    assert f["a"]["excl_ns"] == 10
    assert f["t"]["incl_ns"] == 50      # outer t frame: 20..70
    assert f["t"]["max_recursion"] == 2
    assert f["c"]["excl_ns"] == 10
    assert result.find_path("main", "a", "t", "t", "c")["calls"] == 1
    assert result.counters["unwound_frames"] == result.counters["open_frames"] == 0
    assert result.counters["completed_frames"] == 5


def test_entry_frame_reached_by_tail_jump_nests_and_returns(tmp_path):
    # a tail-jumps into entry-patched e: e's frame has a's rsp and its own exit
    directory = write_trace(tmp_path, [
        E(0, "a", 900), E(5, "e", 900), X(9, "e", 900), X(10, "a", 900), E(20, "a", 900),
        X(30, "a", 900)])
    result = calltree.analyze_calls(directory)
    assert result.find_path("a", "e")["completed"] == 1
    assert result.functions["a"]["completed"] == 2
    assert result.counters["unwound_frames"] == 0


def test_longjmp_frames_are_unwound_by_later_records(tmp_path):
    # main -> a -> b -> b -> (tail) t; longjmp back into a; a calls c at the outer
    # b's rsp; a returns, main calls b again
    directory = write_trace(tmp_path, [
        E(0, "main", 1000), E(10, "a", 900), E(20, "b", 800), E(30, "b", 700),
        E(40, "t", 700), E(50, "c", 800), X(60, "c", 800), X(70, "a", 900),
        E(80, "b", 900), X(85, "b", 900), X(100, "main", 1000)])
    result = calltree.analyze_calls(directory)
    f = result.functions
    # both b frames and t, enclosed in the inner b, end at 50, unwound
    assert f["b"]["unwound"] == 2 and f["b"]["completed"] == 1
    assert f["t"]["unwound"] == 1 and f["t"]["completed"] == 0
    assert f["b"]["incl_ns"] == 30 + 5  # outermost b frame 20..50, then 80..85
    assert result.counters["unwound_frames"] == 3
    assert result.find_path("main", "a", "c")["calls"] == 1
    assert result.find_path("main", "b")["completed"] == 1


def test_tail_jump_from_an_untraced_frame_completes(tmp_path):
    # a calls an untraced function that tail-jumps to t: no traced frame at t's rsp
    directory = write_trace(tmp_path, [
        E(0, "a", 900), E(10, "t", 850), X(20, "a", 900), E(30, "b", 900), E(40, "t", 850),
        E(50, "c", 850), X(60, "c", 850), X(70, "b", 900)])
    result = calltree.analyze_calls(directory)
    f = result.functions
    assert f["t"]["completed"] == 2 and f["t"]["unwound"] == 0
    assert f["t"]["incl_ns"] == 10 + 10   # 10..20 (a returned), 40..50 (c called at its rsp)
    assert result.find_path("a", "t")["calls"] == result.find_path("b", "t")["calls"] == 1
    assert result.find_path("b", "c")["calls"] == 1
    assert result.counters["unwound_frames"] == 0


def test_attach_tolerates_unmatched_exits_and_open_frames(tmp_path):
    directory = write_trace(tmp_path, [
        X(0, "b", 800), E(10, "c", 850), X(20, "c", 850), X(30, "a", 900),
        E(40, "a", 900), E(50, "b", 800)])
    result = calltree.analyze_calls(directory)
    c = result.counters
    assert c["unmatched_exits"] == 2
    assert c["open_frames"] == 2
    assert result.functions["a"]["open"] == result.functions["b"]["open"] == 1
    assert result.functions["c"]["completed"] == 1
    assert result.functions["a"]["incl_ns"] == 10   # open frames are timed to the last record


def test_rsp_low32_wraps_inside_one_stack(tmp_path):
    # the stack crosses a 4 GiB boundary of its low 32 bits: 0x10 is above 0xFFFFFF00
    directory = write_trace(tmp_path, [
        E(0, "a", 0x10), E(10, "b", 0xFFFFFF00), E(20, "c", 0xFFFFFE00), X(30, "c", 0xFFFFFE00),
        X(40, "b", 0xFFFFFF00), E(45, "b", 0xFFFFFF00), X(46, "b", 0xFFFFFF00),
        X(50, "a", 0x10)])
    result = calltree.analyze_calls(directory)
    assert result.counters["unwound_frames"] == result.counters["unmatched_exits"] == 0
    assert result.find_path("a", "b", "c")["calls"] == 1
    assert result.find_path("a", "b")["calls"] == 2


def test_untimed_written_trace_has_null_times(tmp_path):
    directory = write_trace(tmp_path, [E(0, "a", 900), X(0, "a", 900)], timestamps=False)
    result = calltree.analyze_calls(directory)
    assert result.functions["a"] == dict(calls=1, completed=1, unwound=0, open=0, incl_ns=None,
                                         excl_ns=None, max_depth=1, max_recursion=1)


def test_corrupt_inputs_raise_corrupt_trace_error(tmp_path):
    directory = write_trace(tmp_path, [E(0, "a", 900), X(1, "a", 900)])
    path = os.path.join(directory, "calls", "100.rec")
    fd = CALL_RECORDS.create(path)                   # an exit code of a tail site
    CALL_RECORDS.append(fd, np.array([(2, (3 << 1) | 1, 900)], dtype=RECORD_DTYPE))
    os.close(fd)
    with pytest.raises(CorruptTraceError, match="record 2"):
        calltree.analyze_calls(directory)
    with open(os.path.join(directory, "functions.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(CorruptTraceError, match="functions.json"):
        calltree.analyze_calls(directory)
