# SPDX-License-Identifier: GPL-2.0-or-later
"""The segmentation (madtrace.trace.segmentation): every access belongs to
the call it was made in, whatever the frame rules had to do (longjmp, tail
calls, threads), in bounded chunks.

Oracles: valgrind lackey (the accesses each function's own instructions
made, per function: segmentation must put each of them in a call of that
function), the program's own counts (calls), hand-written record files with
the calls worked out by hand, and the whole-file replay (chunks of any size
give the same stream)."""

from __future__ import annotations

import collections
import json
import os
import subprocess

import numpy as np
import pytest

from madtrace.trace import segmentation as sg
from madtrace.binary.elf import ElfImage
from madtrace.trace.format import ACCESS_DTYPE
from madtrace.trace.record_files import ACCESS_RECORDS, CALL_RECORDS

from .oracles import lackey_accesses
from .test_data import _locked_rmw, sections
from .test_report import E, X, write_trace
from .util import madtrace, prog

# (program, variant, arguments): longjmp over traced frames, tail jumps (-O2),
# threads with atomics, plain globals
PROGRAMS = [("calls_longjmp", "O2-nopie", ["40"]), ("calls_tail", "O2-nopie", ["150"]),
            ("calls_threads", "O0-nopie", ["2", "60"]), ("data_globals", "O0-nopie", [])]


def record(directory, argv, *options):
    result = madtrace("record", "-q", "--data", "-o", str(directory), *options, "--", *argv,
                      timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    return result


def stream(directory, chunk_rows=sg.DEFAULT_CHUNK_ROWS):
    """Every chunk's events, segments and accesses, concatenated per thread."""
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for chunk in sg.iter_thread_chunks(str(directory), chunk_rows=chunk_rows):
        out[chunk.tid]["events"].append(chunk.events.copy())
        out[chunk.tid]["segments"].append(chunk.segments.copy())
        out[chunk.tid]["accesses"].append(chunk.accesses.copy())
        if chunk.last:
            out[chunk.tid]["stats"] = chunk.stats
    return {tid: {k: (np.concatenate(v) if k != "stats" else v) for k, v in parts.items()}
            for tid, parts in out.items()}


def function_of(image: ElfImage):
    """Vectorised address -> function name of a non-PIE executable ('' outside)."""
    funcs = sorted((s.address, s.address + max(s.size, 1), s.name) for s in image.functions())
    starts = np.array([f[0] for f in funcs], dtype=np.uint64)
    ends = np.array([f[1] for f in funcs], dtype=np.uint64)
    names = np.array([f[2] for f in funcs] + [""], dtype=object)

    def lookup(addresses: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, addresses, side="right").astype(np.int64) - 1
        inside = (i >= 0) & (addresses < ends[np.maximum(i, 0)])
        return names[np.where(inside, i, len(funcs))]
    return lookup


@pytest.mark.parametrize("program,variant,args", PROGRAMS)
def test_accesses_belong_to_the_function_whose_instructions_made_them(tmp_path, program,
                                                                      variant, args):
    """Each access of a traced function's own instructions is in a call of that
    function (the innermost traced call), and per function they are exactly
    the loads and stores lackey sees those instructions make."""
    path = prog(program, variant)
    argv = [path, *args]
    directory = tmp_path / "t"
    native = subprocess.run(argv, capture_output=True, timeout=60)
    assert record(directory, argv).stdout == native.stdout
    tables = sg.load_tables(str(directory))
    with open(directory / "functions.json") as f:
        traced = {fn["name"] for fn in json.load(f)["functions"] if fn["method"] != "skipped"}
    image = ElfImage.load(path)
    text = image.section(".text")
    data = sections(path, ".data", ".bss")
    lookup = function_of(image)
    got: dict[str, dict[str, int]] = {}
    wrong = collections.Counter()
    for tid, s in stream(directory).items():
        events, acc = s["events"], s["accesses"]
        access_events = events[events["type"] == sg.EVENT_ACCESS]
        assert len(access_events) == len(acc) == s["stats"]["accesses"]
        assert (access_events["ref"] == np.arange(len(acc))).all()
        rip, addr = acc["rip"], acc["addr"]
        own = (rip >= text.address) & (rip < text.address + text.size)
        in_data = np.zeros(len(acc), dtype=bool)
        for lo, hi in data:
            in_data |= (addr >= lo) & (addr < hi)
        keep = own & in_data
        functions = lookup(rip[keep])
        call_names = np.array(tables.names + ["<outside>"], dtype=object)[
            access_events["fid"][keep]]
        for fn, call_fn, kind in zip(functions, call_names, acc["kind"][keep]):
            entry = got.setdefault(fn, {"L": 0, "S": 0})
            entry["L" if kind == 1 else "S"] += 1
            if fn in traced and fn != call_fn:
                wrong[(fn, call_fn)] += 1
    assert not wrong, wrong
    assert {fn for fn in got if fn in traced} >= {"main"}
    oracle = lackey_accesses(argv, (text.address, text.address + text.size), data)
    locked = _locked_rmw(image, text, {address for address, _ in oracle})
    expected: dict[str, dict[str, int]] = {}
    for (address, kind), n in oracle.items():
        if kind == "L" and address in locked:
            n -= oracle.get((address, "S"), 0)   # valgrind's extra load of a locked RMW
        fn = lookup(np.array([address], dtype=np.uint64))[0]
        expected.setdefault(fn, {"L": 0, "S": 0})[kind] += n
    assert got == expected


def test_chunks_of_any_size_give_the_same_stream(tmp_path):
    """longjmp-unwound frames across chunk boundaries: chunks of 1, 3 and 7
    rows give exactly the whole-file events and segments."""
    directory = tmp_path / "t"
    record(directory, [prog("calls_longjmp", "O2-nopie"), "12"])
    whole = stream(directory)
    for rows in (1, 3, 7):
        parts = stream(directory, chunk_rows=rows)
        assert parts.keys() == whole.keys()
        for tid in whole:
            for key in ("events", "segments", "accesses"):
                assert (parts[tid][key] == whole[tid][key]).all(), (rows, key)
            assert parts[tid]["stats"] == whole[tid]["stats"]
    (s,) = whole.values()
    segments = s["segments"]
    # call ids: 0..n-1 in the order the calls began; every call ends once
    begins = s["events"][s["events"]["type"] == sg.EVENT_BEGIN]
    assert (begins["call_id"] == np.arange(len(begins))).all()
    assert sorted(segments["call_id"].tolist()) == list(range(len(begins)))
    # the accesses of a call lie between its begin and end records
    for row in segments[segments["accesses_incl"] > 0][:50]:
        calls = [row["call_id"]]
        inside = (s["accesses"]["seq"] > row["begin_seq"]) & \
            (s["accesses"]["seq"] <= row["end_seq"])
        assert int(np.count_nonzero(inside)) == row["accesses_incl"], calls
    names = sg.load_tables(str(directory)).names
    fates = collections.Counter((names[f], sg.FATES[x]) for f, x in
                                zip(segments["fid"], segments["fate"]))
    own = {k: int(v) for k, v in (item.split("=") for item in subprocess.run(
        [prog("calls_longjmp", "O2-nopie"), "12"], capture_output=True).stdout.decode()
        .splitlines()[-1][len("calls: "):].split())}
    assert fates[("dive", "unwound")] == own["dive"] and fates[("bail", "unwound")] == own["bail"]
    assert fates[("after", "completed")] == own["after"]


def test_segment_counts_add_up(tmp_path):
    """accesses_self summed over calls = the accesses in calls; accesses_incl of
    a call = its own + its callees' incl; the parent of a call encloses it."""
    directory = tmp_path / "t"
    record(directory, [prog("calls_tail", "O2-nopie"), "60"])
    for tid, s in stream(directory).items():
        seg = s["segments"]
        access_events = s["events"][s["events"]["type"] == sg.EVENT_ACCESS]
        in_calls = access_events[access_events["call_id"] >= 0]
        per_call = collections.Counter(in_calls["call_id"].tolist())
        assert {int(c): int(n) for c, n in zip(seg["call_id"], seg["accesses_self"]) if n} == \
            dict(per_call)
        children = collections.Counter()
        by_id = {int(r["call_id"]): r for r in seg}
        for row in seg:
            if row["parent_id"] >= 0:
                children[int(row["parent_id"])] += int(row["accesses_incl"])
                parent = by_id[int(row["parent_id"])]
                assert parent["begin_seq"] <= row["begin_seq"] <= row["end_seq"] <= \
                    parent["end_seq"]
                assert row["depth"] == parent["depth"] + 1
        for row in seg:
            assert row["accesses_incl"] == row["accesses_self"] + children[int(row["call_id"])]
        assert (seg["bytes_incl"] >= seg["bytes_self"]).all()


# ------------------------------------------------- hand-written records
def add_accesses(directory: str, tid: int, seqs: list[int]) -> None:
    os.makedirs(os.path.join(directory, "data"), exist_ok=True)
    acc = np.zeros(len(seqs), dtype=ACCESS_DTYPE)
    acc["seq"] = seqs
    acc["size"] = 4
    acc["kind"] = 1
    acc["addr"] = 0x1000 + np.arange(len(seqs))
    ACCESS_RECORDS.write(os.path.join(directory, "data", f"{tid}.acc"), acc)


def calls_of(directory: str, chunk_rows: int = 1 << 18) -> tuple[dict, list[int]]:
    """{call_id: (function, parent, fate, accesses_self, accesses_incl)}, and
    the call id of each access."""
    names = sg.load_tables(directory).names
    calls, ids = {}, []
    for chunk in sg.iter_thread_chunks(directory, chunk_rows=chunk_rows):
        for row in chunk.segments:
            calls[int(row["call_id"])] = (names[row["fid"]], int(row["parent_id"]),
                                          sg.FATES[row["fate"]], int(row["accesses_self"]),
                                          int(row["accesses_incl"]))
        ids += chunk.access_call_ids.tolist()
    return calls, ids


def test_longjmp_and_tail_frames_get_their_accesses(tmp_path):
    # main -> a -> b -> b -> (tail) t; longjmp back into a; a calls c at the
    # outer b's rsp; a returns, main calls b again (test_report's trace)
    directory = write_trace(tmp_path, [
        E(0, "main", 1000), E(10, "a", 900), E(20, "b", 800), E(30, "b", 700),
        E(40, "t", 700), E(50, "c", 800), X(60, "c", 800), X(70, "a", 900),
        E(80, "b", 900), X(85, "b", 900), X(100, "main", 1000)])
    # an access before any record, one in main, two in t (after record 4: the
    # longjmp is only proved by c's entry), one in c, one in a after c
    # returned, one after everything
    add_accesses(directory, 100, [0, 1, 5, 5, 6, 7, 11])
    for rows in (1, 2, 100):
        calls, ids = calls_of(directory, rows)
        assert calls == {
            0: ("main", -1, "completed", 1, 5), 1: ("a", 0, "completed", 1, 4),
            2: ("b", 1, "unwound", 0, 2), 3: ("b", 2, "unwound", 0, 2),
            4: ("t", 3, "unwound", 2, 2), 5: ("c", 1, "completed", 1, 1),
            6: ("b", 0, "completed", 0, 0)}, rows
        assert ids == [-1, 0, 4, 4, 5, 1, -1]


def test_unmatched_exit_and_open_frames(tmp_path):
    directory = write_trace(tmp_path, [
        X(0, "b", 800), E(10, "c", 850), X(20, "c", 850), X(30, "a", 900),
        E(40, "a", 900), E(50, "b", 800)])
    add_accesses(directory, 100, [1, 2, 5, 6, 6])
    calls, ids = calls_of(directory)
    assert calls == {0: ("b", -1, "unmatched", 0, 0), 1: ("c", -1, "completed", 1, 1),
                     2: ("a", -1, "unmatched", 0, 0), 3: ("a", -1, "open", 1, 3),
                     4: ("b", 3, "open", 2, 2)}
    assert ids == [-1, 1, 3, 4, 4]


def test_threads_number_their_calls_one_after_the_other(tmp_path):
    directory = write_trace(tmp_path, [E(0, "a", 900), X(1, "a", 900)])
    other = CALL_RECORDS.read(os.path.join(directory, "calls", "100.rec"))
    CALL_RECORDS.write(os.path.join(directory, "calls", "200.rec"), np.concatenate([other, other]))
    add_accesses(directory, 300, [0, 0])           # a thread with accesses only
    calls, ids = calls_of(directory)
    assert sorted(calls) == [0, 1, 2]
    assert ids == [-1, -1]
    tids = [c.tid for c in sg.iter_thread_chunks(directory) if c.last]
    assert tids == [100, 200, 300]


def test_segment_columns_are_the_rows_fields():
    """replay.segment_columns (one C pass) gives each field of random segment rows,
    and the calls' places in the merged stream as the store documents them:
    begin_pos = begin_seq + accesses_before (-1 for a call begun before the
    records), end_pos = end_seq + accesses_before + accesses_incl."""
    from madtrace.trace.replay import SEGMENT_COLUMNS, SEGMENT_DTYPE, segment_columns
    rng = np.random.default_rng(7)
    rows = np.zeros(10_007, dtype=SEGMENT_DTYPE)
    for name in SEGMENT_DTYPE.names:
        if name != "pad":
            info = np.iinfo(rows[name].dtype)
            rows[name] = rng.integers(max(info.min, -(1 << 40)), min(info.max, 1 << 40),
                                      len(rows), dtype=rows[name].dtype, endpoint=True)
    rows["begin_seq"][::5] = -1
    rows["outer"][::3] = 0
    columns = segment_columns(rows)
    assert list(columns) == [name for name, _ in SEGMENT_COLUMNS]
    for name, values in columns.items():
        if name in ("begin_pos", "end_pos", "outermost"):
            continue
        assert np.array_equal(values, rows[name].astype(values.dtype)), name
    assert np.array_equal(columns["outermost"], rows["outer"] != 0)
    before = rows["accesses_before"]
    assert np.array_equal(columns["begin_pos"],
                          np.where(rows["begin_seq"] < 0, -1, rows["begin_seq"] + before))
    assert np.array_equal(columns["end_pos"],
                          rows["end_seq"] + before + rows["accesses_incl"])
    assert all(len(v) == 0 for v in segment_columns(rows[:0]).values())
