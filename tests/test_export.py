"""Exports of data traces: MadT's text format round trip, and the lackey
format compared with valgrind lackey's own output per instruction."""

from __future__ import annotations

import collections
import json
import os
import shutil

import pytest

from madtrace.binary.elf import ElfImage
from madtrace.trace.events import load_accesses
from madtrace.trace.madt import parse_line

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
    with open(directory / "data" / "allocations.json") as f:
        blocks = json.load(f)
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
    one_line_error(madtrace("export", str(directory), "--format", "madt"), 18, "without --data")
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


def test_chrome_export_is_cut_at_max_events(tmp_path):
    directory = tmp_path / "t"
    assert madtrace("record", "-q", "-o", str(directory), "--",
                    prog("calls_recursion", "O2-nopie")).returncode == 0
    result = madtrace("export", str(directory), "--format", "chrome", "--max-events", "500")
    assert result.returncode == 0
    err = result.stderr.decode().splitlines()
    assert len(err) == 1 and err[0].startswith("madtrace: export: the trace has ") and \
        "--max-events" in err[0]
    per_thread = check_trace_events(json.loads(result.stdout))
    kept = sum(len(x) + len(i) for x, i in per_thread.values())
    assert 0 < kept <= 500
    one_line_error(madtrace("export", str(directory), "--format", "chrome", "--max-events", "0"),
                   2, "--max-events")


def test_chrome_json_loads_in_perfetto_trace_processor(tmp_path):
    """Perfetto's trace processor (PyPI perfetto) needs its native
    trace_processor_shell, which it downloads on first use; offline, give it
    with TRACE_PROCESSOR_SHELL=/path/to/trace_processor_shell."""
    shell = os.environ.get("TRACE_PROCESSOR_SHELL") or shutil.which("trace_processor_shell")
    if not shell:
        pytest.skip("no trace_processor_shell (set TRACE_PROCESSOR_SHELL): perfetto cannot "
                    "download it offline")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    directory = tmp_path / "t"
    assert madtrace("record", "-q", "--data", "-o", str(directory), "--",
                    prog("calls_longjmp", "O2-nopie"), "10", timeout=300).returncode == 0
    out = tmp_path / "trace.json"
    assert madtrace("export", str(directory), "--format", "chrome", "-o", str(out)).returncode == 0
    doc = json.loads(out.read_text())
    slices = sum(1 for e in doc["traceEvents"] if e["ph"] in ("X", "i"))
    tp = TraceProcessor(trace=str(out), config=TraceProcessorConfig(bin_path=shell))
    try:
        (row,) = list(tp.query("SELECT count(*) AS n FROM slice"))
        assert row.n == slices
        stats = list(tp.query("SELECT name, value FROM stats WHERE severity = 'error' "
                              "AND value > 0"))
        assert not stats, [(s.name, s.value) for s in stats]
    finally:
        tp.close()


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
    assert json.loads((out / "store_meta.json").read_text())["format_version"] == 1
    one_line_error(madtrace("export", str(directory), "--format", "parquet", "-o", str(out)), 17,
                   "--force")
    one_line_error(madtrace("export", str(directory), "--format", "parquet"), 2, "-o DIR")
