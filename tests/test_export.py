"""Exports: MadT's text format round trip (against the store's events), the
lackey format compared with valgrind lackey's own output per instruction,
the Chrome/Perfetto JSON checked against the trace-event rules and loaded by
Perfetto's own trace processor (its WebAssembly build: tests/perfetto_tp.py),
the Parquet copy of the store."""

from __future__ import annotations

import collections
import json
import shutil

import numpy as np
import pytest

from madtrace.binary.elf import ElfImage
from madtrace.trace.events import load_accesses, load_allocations
from madtrace.trace.madt import parse_line
from madtrace.trace.format import STORE_FORMAT_VERSION as STORE_FORMAT

from .oracles import lackey_accesses, parse_lackey
from .util import madtrace, one_line_error, prog


def record_data(tmp_path, program="data_heap", variant="O0-nopie"):
    directory = tmp_path / "t"
    result = madtrace("record", "-q", "--data", "-f", "chase", "-f", "grow", "-o", str(directory),
                      "--", prog(program, variant), timeout=300)
    assert result.returncode == 0, result.stderr
    return directory


def test_madt_round_trip(tmp_path):
    """export madt (raw and symbolic) -> parse -> the same events as the store."""
    directory = record_data(tmp_path)
    raw = madtrace("export", str(directory), "--format", "madt", "--raw")
    symbolic = madtrace("export", str(directory), "--format", "madt")
    assert raw.returncode == 0 and symbolic.returncode == 0
    raw_lines = [parse_line(line) for line in raw.stdout.decode().splitlines()]
    sym_lines = [parse_line(line) for line in symbolic.stdout.decode().splitlines()]
    assert len(raw_lines) == len(sym_lines)
    assert [l["kind"] for l in raw_lines] == [l["kind"] for l in sym_lines]
    # the raw accesses are exactly the stored ones, in order, with the same sizes
    stored = collections.Counter()
    for tid, arr in load_accesses(str(directory)).items():
        for rec in arr:
            stored[("L" if rec["kind"] == 1 else "S", int(rec["addr"]), int(rec["size"]),
                    int(rec["rip"]))] += 1
    exported = collections.Counter()
    for line in raw_lines:
        if line["kind"] in "LS":
            addr, size, _region, rip = line["fields"]
            exported[(line["kind"], int(addr, 16), int(size), int(rip, 16))] += 1
    assert exported == stored
    blocks = load_allocations(directory)
    kinds = collections.Counter(l["kind"] for l in sym_lines if l["kind"] in "MCRF")
    assert kinds["M"] + kinds["C"] + kinds["R"] == len(blocks)
    assert kinds["F"] == sum(1 for b in blocks if b["freed_seq"] is not None)
    # symbolic heap accesses name their block the MadT way
    chase = [l for l in sym_lines if l["kind"] == "L" and l["fields"][2].startswith("chase+")]
    assert chase and all(l["fields"][0].startswith("<malloc") and l["fields"][1] == "[heap]"
                         for l in chase)


def test_lackey_export_equals_valgrind_lackey(tmp_path):
    path = prog("data_globals", "O2-nopie")
    directory = tmp_path / "t"
    assert madtrace("record", "-q", "--data", "--no-functions", "-o", str(directory), "--",
                    path, timeout=300).returncode == 0
    out = tmp_path / "export.lackey"
    assert madtrace("export", str(directory), "--format", "lackey", "-o", str(out)).returncode == 0
    image = ElfImage.load(path)
    text = image.section(".text")
    code = (text.address, text.address + text.size)
    data = [(s.address, s.address + s.size) for s in image.sections
            if s.name in (".data", ".bss") and s.size]
    assert parse_lackey(str(out), code, data) == lackey_accesses([path], code, data)
    # never overwritten without --force
    one_line_error(madtrace("export", str(directory), "--format", "lackey", "-o", str(out)), 17,
                   "--force")


def test_export_needs_a_data_trace(tmp_path):
    directory = tmp_path / "t"
    assert madtrace("record", "-q", "--no-functions", "-o", str(directory), "--",
                    prog("data_globals", "O0-pie")).returncode == 0
    one_line_error(madtrace("export", str(directory), "--format", "madt"), 24, "record it with --data")
    one_line_error(madtrace("export", str(tmp_path / "nothing"), "--format", "madt"), 18, "nothing")


# ------------------------------------------------ madt: the store's events
def test_madt_export_is_the_store_event_stream(tmp_path):
    """export madt --raw -> parse -> exactly the store's accesses and
    allocation events, in the tracer's order."""
    from madtrace.trace.query import connect
    directory = record_data(tmp_path)
    raw = madtrace("export", str(directory), "--format", "madt", "--raw")
    assert raw.returncode == 0, raw.stderr
    lines = [parse_line(line) for line in raw.stdout.decode().splitlines()]
    con = connect(str(directory))
    threads: dict[int, int] = {}
    expected = []
    rows = con.execute("""
        SELECT "order", kind::VARCHAR, tid, addr, size, rip FROM accesses
        UNION ALL SELECT "order", CASE kind WHEN 'calloc' THEN 'C' WHEN 'realloc' THEN 'R'
                                            ELSE 'M' END, tid, address, size, NULL FROM allocations
        UNION ALL SELECT freed_order, 'F', freed_tid, address, NULL, NULL FROM allocations
                  WHERE freed_order IS NOT NULL
        ORDER BY 1""").fetchall()
    for _order, kind, tid, addr, size, rip in rows:
        thread = threads.setdefault(tid, len(threads))
        expected.append((kind, thread, addr) + ((size, rip) if kind in "LS" else
                                                (size,) if kind != "F" else ()))
    got = []
    for line in lines:
        f = line["fields"]
        if line["kind"] in "LS":
            got.append((line["kind"], line["thread"], int(f[0], 16), int(f[1]), int(f[3], 16)))
        elif line["kind"] == "F":
            got.append(("F", line["thread"], int(f[0], 16)))
        else:
            got.append((line["kind"], line["thread"], int(f[0], 16), int(f[1])))
    assert got == expected and len(got) > 100


# ------------------------------------------------------------ chrome JSON
def check_trace_events(doc: dict) -> dict:
    """The JSON trace event format (what Perfetto's and Chrome's JSON importers
    require of the events we write): a traceEvents list; X events with ts and
    dur >= 0, properly nested on each thread; thread-scoped instants; M
    metadata.  Returns {tid: (X events, i events)}."""
    assert isinstance(doc["traceEvents"], list)
    per_thread: dict[int, tuple[list, list]] = {}
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "i", "M")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and "name" in e["args"]
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        slices, instants = per_thread.setdefault(e["tid"], ([], []))
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
            slices.append(e)
        else:
            assert e["s"] == "t" and e["cat"] in ("L", "S")
            instants.append(e)
    for slices, instants in per_thread.values():
        # in integer ns, as the importers read the µs values
        spans = sorted(((round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000))
                        for e in slices), key=lambda s: (s[0], -s[1]))
        stack: list[tuple[int, int]] = []
        for begin, end in spans:
            while stack and begin >= stack[-1][1] and (begin, end) != stack[-1]:
                stack.pop()
            if stack:    # inside its parent, never across its end
                assert end <= stack[-1][1], ((begin, end), stack[-1])
            stack.append((begin, end))
    return per_thread


@pytest.mark.parametrize("program,args,options", [
    ("calls_longjmp", ["20"], ["--data"]),              # unwound calls, accesses inside them
    ("calls_threads", ["3", "200"], []),                # four threads, timed
    ("calls_recursion", [], ["--no-time"]),             # untimed: record positions
])
def test_chrome_export_is_a_valid_nested_timeline(tmp_path, program, args, options):
    from madtrace.trace.query import connect
    directory = tmp_path / "t"
    assert madtrace("record", "-q", *options, "-o", str(directory), "--",
                    prog(program, "O2-nopie"), *args, timeout=300).returncode == 0
    out = tmp_path / "trace.json"
    result = madtrace("export", str(directory), "--format", "chrome", "-o", str(out))
    assert result.returncode == 0 and result.stderr == b"", result.stderr
    per_thread = check_trace_events(json.loads(out.read_text()))
    con = connect(str(directory))
    calls = dict(con.execute("SELECT tid, count(*) FROM calls WHERE fate <> 'unmatched' "
                             "GROUP BY tid").fetchall())
    accesses = dict(con.execute("SELECT tid, count(*) FROM accesses GROUP BY tid").fetchall())
    assert {t: len(x) for t, (x, _) in per_thread.items() if x} == calls
    assert {t: len(i) for t, (_, i) in per_thread.items() if i} == accesses
    names = collections.Counter(e["name"] for x, _ in per_thread.values() for e in x)
    assert names == collections.Counter(dict(con.execute(
        "SELECT function, count(*) FROM calls WHERE fate <> 'unmatched' GROUP BY 1").fetchall()))
    if accesses:
        # an access lies inside the slice of the call it was made in
        (x, instants), = per_thread.values()
        by_id = {e["args"]["call_id"]: e for e in x}
        ids = [c for (c,) in con.execute("SELECT call_id FROM accesses ORDER BY pos").fetchall()]
        ordered = sorted(instants, key=lambda e: e["ts"])
        for e, call in zip(ordered, ids):
            if call >= 0:
                s = by_id[call]
                assert s["ts"] <= e["ts"] <= s["ts"] + s["dur"] + 1e-3


def test_chrome_export_beyond_max_events_covers_the_whole_run(tmp_path):
    """A trace larger than the budget is exported whole at a coarser grain: its
    longest calls, at most the budget, nested as before, the outermost call
    among them; the file and one line on stderr say what was left out."""
    from madtrace.trace.query import connect
    directory = tmp_path / "t"
    assert madtrace("record", "-q", "--data", "-o", str(directory), "--",
                    prog("calls_longjmp", "O2-nopie"), "30", timeout=300).returncode == 0
    con = connect(str(directory))
    calls, = con.execute("SELECT count(*) FROM calls WHERE fate <> 'unmatched'").fetchone()
    accesses, = con.execute("SELECT count(*) FROM accesses").fetchone()
    assert calls > 200 and accesses > 0
    result = madtrace("export", str(directory), "--format", "chrome", "--max-events", "200")
    assert result.returncode == 0
    err = result.stderr.decode().splitlines()
    assert len(err) == 1 and "exported the whole run" in err[0] and "--max-events 200" in err[0]
    doc = json.loads(result.stdout)
    per_thread = check_trace_events(doc)
    slices = [e for x, _ in per_thread.values() for e in x]
    assert 0 < len(slices) <= 200 and not any(i for _, i in per_thread.values())
    coverage = doc["otherData"]["coverage"]
    assert coverage["calls"] == calls and coverage["accesses"] == accesses
    assert coverage["calls_kept"] == len(slices) and coverage["accesses_kept"] == 0
    # the longest calls: every one left out is shorter than every one kept
    shortest = min(e["dur"] for e in slices)
    left_out, = con.execute("SELECT count(*) FROM calls WHERE fate <> 'unmatched' AND "
                            "duration_ns > ?", [shortest * 1000 * 1.1 + 1]).fetchone()
    assert left_out <= len(slices)
    longest, = con.execute("SELECT max(duration_ns) FROM calls").fetchone()
    assert max(e["dur"] for e in slices) * 1000 >= 0.9 * longest


def test_chrome_export_is_cut_at_max_events_with_first(tmp_path):
    directory = tmp_path / "t"
    assert madtrace("record", "-q", "-o", str(directory), "--",
                    prog("calls_recursion", "O2-nopie")).returncode == 0
    result = madtrace("export", str(directory), "--format", "chrome", "--max-events", "500",
                      "--first")
    assert result.returncode == 0
    err = result.stderr.decode().splitlines()
    assert len(err) == 1 and err[0].startswith("madtrace: export: the trace has ") and \
        "--max-events" in err[0]
    per_thread = check_trace_events(json.loads(result.stdout))
    kept = sum(len(x) + len(i) for x, i in per_thread.values())
    assert 0 < kept <= 500
    one_line_error(madtrace("export", str(directory), "--format", "chrome", "--max-events", "0"),
                   2, "--max-events")


@pytest.mark.parametrize("program,args,options", [
    ("calls_longjmp", ["10"], ["--data"]),     # unwound calls, accesses inside them
    ("calls_threads", ["2", "100"], []),       # three threads
])
def test_chrome_json_loads_in_perfetto_trace_processor(tmp_path, program, args, options):
    """Perfetto's own trace processor (its WebAssembly build, driven through the
    PyPI perfetto package: tests/perfetto_tp.py) loads the export without an
    error and finds every call and access as a slice of its thread, calls
    nested as exported."""
    directory = tmp_path / "t"
    assert madtrace("record", "-q", *options, "-o", str(directory), "--",
                    prog(program, "O2-nopie"), *args, timeout=300).returncode == 0
    check_in_perfetto(directory, tmp_path / "trace.json")


def check_in_perfetto(directory, out) -> None:
    """The chrome export of ``directory`` loaded by Perfetto's trace processor:
    no error, every call and access a slice of its thread, each call at its
    exported time and nested at the depth madtrace's segmentation gave it."""
    from .perfetto_tp import trace_processor
    assert madtrace("export", str(directory), "--format", "chrome", "-o", str(out)).returncode == 0
    doc = json.loads(out.read_text())
    events = [e for e in doc["traceEvents"] if e["ph"] in ("X", "i")]
    with trace_processor(str(out)) as tp:
        errors = [(r.name, r.value) for r in tp.query(
            "SELECT name, value FROM stats WHERE severity IN ('error', 'data_loss') AND value > 0")]
        rows = list(tp.query("""
            SELECT s.category, s.name, s.ts, s.dur, s.depth, t.tid,
                   extract_arg(s.arg_set_id, 'args.call_id') AS call_id
            FROM slice s JOIN thread_track tt ON s.track_id = tt.id JOIN thread t USING (utid)"""))
        thread_names = {r.name for r in tp.query("SELECT name FROM thread WHERE tid > 0")}
    assert not errors, errors
    assert collections.Counter((r.tid, r.category, r.name) for r in rows) == \
        collections.Counter((e["tid"], e["cat"], e["name"]) for e in events)
    assert thread_names == {f"thread {t}" for t in {e["tid"] for e in events}}
    # each call at its exported time (ns), nested at the depth the segmentation gave it
    calls = [r for r in rows if r.category == "call"]
    assert sorted((r.tid, r.ts, r.dur, r.name) for r in calls) == sorted(
        (e["tid"], round(e["ts"] * 1000), round(e["dur"] * 1000), e["name"])
        for e in events if e["ph"] == "X")
    from madtrace.trace.query import connect
    depth = dict(connect(str(directory)).execute("SELECT call_id, depth FROM calls").fetchall())
    assert {r.call_id: r.depth + 1 for r in calls} == \
        {c: d for c, d in depth.items() if c in {r.call_id for r in calls}}
    assert max(r.depth for r in calls) >= 2


def test_chrome_nesting_survives_a_tsc_running_behind(tmp_path):
    """A thread's records read from TSCs that disagree (the thread moved to a CPU
    whose counter runs behind, a VM's unsynchronised vCPUs), and records with
    equal counts: the records' order is exact, their times are not.  Perfetto
    must still nest every call where madtrace's segmentation put it."""
    from madtrace.trace.record_files import CALL_RECORDS
    directory = tmp_path / "t"
    assert madtrace("record", "-q", "--data", "-o", str(directory), "--",
                    prog("calls_longjmp", "O2-nopie"), "30", timeout=300).returncode == 0
    shutil.rmtree(directory / "store", ignore_errors=True)
    (tid, path), = CALL_RECORDS.files(str(directory))
    records = CALL_RECORDS.read(path)
    tsc = records["tsc"].astype(np.int64)
    tsc[5::7] -= 100_000            # behind the record before
    tsc[3::11] = tsc[2::11][:len(tsc[3::11])]     # equal to the record before
    records["tsc"] = tsc.astype(np.uint64)
    CALL_RECORDS.write(path, records)
    check_in_perfetto(directory, tmp_path / "trace.json")


# ---------------------------------------------------------------- parquet
def test_parquet_export_is_one_file_per_table(tmp_path):
    import pyarrow.parquet as pq
    from madtrace.trace.query import connect
    directory = record_data(tmp_path)
    out = tmp_path / "pq"
    assert madtrace("export", str(directory), "--format", "parquet", "-o", str(out)).returncode == 0
    con = connect(str(directory))
    for table in ("records", "calls", "accesses", "allocations", "sites"):
        exported = pq.read_table(out / f"{table}.parquet")
        assert exported.num_rows == con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        if table in ("records", "calls", "accesses"):
            assert "tid" in exported.column_names
    assert json.loads((out / "store_meta.json").read_text())["format_version"] == STORE_FORMAT
    one_line_error(madtrace("export", str(directory), "--format", "parquet", "-o", str(out)), 17,
                   "--force")
    one_line_error(madtrace("export", str(directory), "--format", "parquet"), 2, "-o DIR")


@pytest.mark.parametrize("max_events", [4, 500, 3000])
def test_the_first_events_cut_never_keeps_more_than_asked(monkeypatch, max_events):
    """Events exactly on the histogram's bin edges (as a timestamp can be): the cut
    keeps the events before the first bin left out, never one more than asked
    (kept "at or before" the edge, a CI run exported 501 events of 500)."""
    from madtrace.trace import chrome
    edges = np.linspace(0.0, 1000.0, chrome.HISTOGRAM_BINS + 1)
    times = np.repeat(edges, 3)               # three events on every edge
    monkeypatch.setattr(chrome, "_event_times", lambda directory, clock: iter([times]))
    limit, total = chrome.cut_time("unused", None, max_events)
    kept = sum(chrome.before_cut(t, limit) for t in times.tolist())
    assert total == len(times) and 0 < kept <= max_events
