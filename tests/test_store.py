# SPDX-License-Identifier: GPL-2.0-or-later
"""The trace store (DIR/store, Parquet) and madtrace query (DuckDB).

Oracles: the raw capture itself (calls/*.rec, data/*.acc: a naive merge of
the two streams gives the events view's order; row counts), the summary
(accesses and calls), the segmentation (calls), and a store built after the
fact against one built with --store when the target ended."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from madtrace.trace import segmentation as sg
from madtrace.trace.format import read_store_meta
from madtrace.trace.record_files import store_is_complete
from madtrace.trace.record_files import CALL_RECORDS
from madtrace.trace.query import connect

from .util import madtrace, one_line_error, prog, summary_json


@pytest.fixture(scope="module")
def longjmp_trace(tmp_path_factory):
    """calls_longjmp with data tracing (two threads' worth is calls_threads
    below): longjmp-unwound calls, accesses inside them."""
    directory = tmp_path_factory.mktemp("store") / "t"
    result = madtrace("record", "-q", "--data", "--store", "-o", str(directory), "--",
                      prog("calls_longjmp", "O2-nopie"), "30", timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    return str(directory)


def query(directory: str, sql: str) -> list:
    result = madtrace("query", directory, sql, "--json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def naive_merge(directory: str, tid: int) -> list[tuple[str, int]]:
    """(type, seq) of a thread's records and accesses in order, merged the
    plain way: the accesses with seq q go between records q-1 and q."""
    records = CALL_RECORDS.read(os.path.join(directory, "calls", f"{tid}.rec"))
    from madtrace.trace.reader import iter_access_chunks   # .acc, or .dat decoded
    chunks = [chunk for _, chunk in iter_access_chunks(directory, tid)]
    accesses = np.concatenate(chunks) if chunks else []
    out, a = [], 0
    for p, code in enumerate(records["code"].tolist()):
        while a < len(accesses) and accesses[a]["seq"] <= p:
            out.append(("L" if accesses[a]["kind"] == 1 else "S", int(accesses[a]["seq"])))
            a += 1
        out.append(("exit" if code & 1 else "entry", p))
    out += [("L" if x["kind"] == 1 else "S", int(x["seq"])) for x in accesses[a:]]
    return out


def test_store_is_written_and_matches_the_capture(longjmp_trace):
    directory = longjmp_trace
    assert store_is_complete(directory)         # --store: built when the target ended
    meta = read_store_meta(directory)
    assert meta["format_version"] == 4 and meta["rows"]["access_rows"] > 0
    con = connect(directory)
    tids = [t for t, _ in sg.thread_files(directory)]
    for tid in tids:
        events = con.execute("SELECT type, seq, pos FROM events WHERE tid = ? ORDER BY pos",
                             [tid]).fetchall()
        assert [(t, s) for t, s, _ in events] == naive_merge(directory, tid)
        assert [p for _, _, p in events] == list(range(len(events)))
    # the calls are the segmentation's, with the accesses of each
    segments = np.concatenate([s for _, s in sg.iter_segments(directory)])
    rows = con.execute("SELECT call_id, fate, accesses_self, accesses_incl FROM calls "
                       "ORDER BY call_id").fetchall()
    order = np.argsort(segments["call_id"])
    assert rows == [(int(s["call_id"]), sg.FATES[s["fate"]], int(s["accesses_self"]),
                     int(s["accesses_incl"])) for s in segments[order]]
    assert {f for (f,) in con.execute("SELECT DISTINCT fate FROM calls").fetchall()} == \
        {"completed", "unwound"}
    # an access is inside its call: begin_pos < pos < end_pos
    outside = con.execute("""SELECT count(*) FROM accesses a JOIN calls c USING (tid, call_id)
                             WHERE NOT (c.begin_pos < a.pos AND a.pos < c.end_pos)""").fetchone()
    assert outside == (0,)
    # accesses are named: the program's counters by their DWARF names
    names = {n for (n,) in con.execute("SELECT DISTINCT data FROM accesses WHERE function = 'dive'")
             .fetchall()}
    assert "n_dive" in names


def test_query_counts_equal_the_summary(longjmp_trace):
    summary = summary_json(longjmp_trace)
    total = sum(c["L"] + c["S"] for c in summary["accesses"].values())
    assert query(longjmp_trace, "SELECT count(*) AS n FROM accesses") == [{"n": total}]
    assert query(longjmp_trace, "SELECT count(*) AS n FROM calls") == \
        [{"n": sum(summary["calls"].values())}]
    per_function = query(longjmp_trace, "SELECT function, count(*) AS n FROM calls GROUP BY 1")
    assert {r["function"]: r["n"] for r in per_function} == \
        {k: v for k, v in summary["calls"].items() if v}


def test_query_text_output_and_errors(longjmp_trace, tmp_path):
    result = madtrace("query", longjmp_trace,
                      "SELECT function, count(*) AS n FROM calls GROUP BY 1 ORDER BY 1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0].split() == ["function", "n"] and any(line.split()[0] == "dive"
                                                         for line in lines[1:])
    one_line_error(madtrace("query", longjmp_trace, "SELEC 1"), 22, "syntax error")
    one_line_error(madtrace("query", longjmp_trace, "SELECT nope FROM calls"), 22, "nope")
    one_line_error(madtrace("query", str(tmp_path / "none"), "SELECT 1"), 18, "none")


def test_a_recording_writes_no_store_and_the_first_query_builds_it(tmp_path, longjmp_trace):
    """By default nothing is written to the store while the target runs nor when
    it ends (the summary counts from the raw files); the first query builds it,
    with the same answers as the store --store built."""
    directory = tmp_path / "t"
    result = madtrace("record", "-q", "--data", "-o", str(directory), "--",
                      prog("calls_longjmp", "O2-nopie"), "30", timeout=300)
    assert result.returncode == 0
    assert not os.path.exists(directory / "store")
    summary = madtrace("summary", str(directory), "--json")
    assert summary.returncode == 0 and summary.stderr == b""
    assert not os.path.exists(directory / "store")          # the summary needs none
    first = madtrace("query", str(directory), "SELECT count(*) FROM events")
    assert first.returncode == 0
    assert "building the store" in first.stderr.decode()
    assert store_is_complete(str(directory))
    again = madtrace("query", str(directory), "SELECT count(*) FROM events")
    assert again.stderr == b"" and again.stdout == first.stdout
    sql = "SELECT kind, data, count(*) AS n FROM accesses GROUP BY ALL ORDER BY ALL"
    assert query(str(directory), sql) == query(longjmp_trace, sql)
    # an incomplete store is built again
    meta = json.loads((directory / "store" / "meta.json").read_text())
    (directory / "store" / "meta.json").write_text(json.dumps(dict(meta, complete=False)))
    rebuilt = madtrace("query", str(directory), "SELECT count(*) FROM events")
    assert "incomplete" in rebuilt.stderr.decode() and rebuilt.stdout == first.stdout
    # a store of the previous format is rebuilt with one line
    (directory / "store" / "meta.json").write_text(json.dumps(dict(meta, format_version=3)))
    older = madtrace("query", str(directory), "SELECT count(*) FROM events")
    assert older.stdout == first.stdout
    assert "is of format 3, not 4" in older.stderr.decode().splitlines()[0]


def test_snapshot_store_is_copied_without_the_live_one(tmp_path, longjmp_trace):
    """copy_trace_files leaves the live store out (the snapshot builds its own)."""
    from madtrace.trace.store import copy_trace_files, record_file_sizes
    target = tmp_path / "copy"
    target.mkdir()
    copy_trace_files(longjmp_trace, str(target), record_file_sizes(longjmp_trace))
    assert not (target / "store").exists() and (target / "calls").exists()
    shutil.rmtree(target)


def test_store_that_cannot_be_written_is_a_one_line_error(tmp_path):
    """(as root a read-only directory is writable: a file where the store's
    folder goes fails the same way)"""
    directory = tmp_path / "t"
    assert madtrace("record", "-q", "-o", str(directory), "--",
                    prog("calls_recursion", "O2-nopie")).returncode == 0
    (directory / "store").write_text("not a folder")
    one_line_error(madtrace("query", str(directory), "SELECT 1"), 23, "cannot write the store")


def test_access_rows_of_a_thread_without_calls_are_its_decoded_accesses(tmp_path):
    """The store's pass over a thread without call records decodes, names and
    writes its columns in one C loop (ap_rows_compact); its rows, ids and counts
    equal what the capture's decoded accesses give, named one by one."""
    from madtrace.trace.access_names import AccessDimensions
    from madtrace.trace.allocator_calls import AllocatorCalls
    from madtrace.trace.columnar import FLAG_ALLOCATOR, FLAG_FIRST, FLAG_STORE
    from madtrace.trace.compact import compact_reader
    from madtrace.trace.naming import AccessNamer
    from madtrace.trace.record_files import ACCESS_RECORDS

    directory = str(tmp_path / "t")
    result = madtrace("record", "-q", "--data", "--no-functions", "-o", directory, "--",
                      prog("data_heap", "O2-pie"), timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    calls = AllocatorCalls.load(directory)
    files = ACCESS_RECORDS.files(directory)
    assert files
    for tid, path in files:
        fused = AccessDimensions(AccessNamer(directory))
        chunks = list(fused.row_chunks(path, calls.spans(tid), 256))   # many chunks
        got = {c: np.concatenate([chunk[c] for chunk in chunks]) for c in chunks[0]}
        rows = np.concatenate(list(compact_reader(path).chunks()))
        assert len(rows) > 1000 and len(chunks) > 3 and len(got["pos"]) == len(rows)
        one_by_one = AccessDimensions(AccessNamer(directory))
        instructions: dict = {}
        want = {
            "pos": np.arange(len(rows)) + rows["seq"].astype(np.int64),
            "seq": rows["seq"].astype(np.int64), "order": rows["order"],
            "call_id": np.full(len(rows), -1), "fid": np.full(len(rows), -1),
            "iid": np.array([instructions.setdefault((rip, size), len(instructions))
                             for rip, size in zip(rows["rip"].tolist(), rows["size"].tolist())]),
            "did": one_by_one.data_ids(rows), "addr": rows["addr"],
            "flags": (np.where(rows["kind"] == 1, 0, FLAG_STORE)
                      | np.where(rows["first"] != 0, FLAG_FIRST, 0)
                      | np.where(calls.inside(tid, rows["order"]), FLAG_ALLOCATOR, 0))}
        assert (want["flags"] & FLAG_ALLOCATOR).any() and (want["flags"] & FLAG_STORE).any()
        for column, values in want.items():
            assert np.array_equal(got[column].astype(np.int64), values.astype(np.int64)), column
        assert np.array_equal(fused.counts(), one_by_one.counts())
        assert np.array_equal(fused.ids.keys(0, 0), one_by_one.ids.keys(0, 0))
