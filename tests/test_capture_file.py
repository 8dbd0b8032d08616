# SPDX-License-Identifier: GPL-2.0-or-later
"""Raw capture files that can be checked (trace/format.py, the capture container).

Every raw file a recording writes (calls/<tid>.rec, data/<tid>.acc of the fault
engine, data/<tid>.dat of the hybrid one, data/allocator_calls.bin,
data/blocks.bin) is damaged the ways disks and people damage files: one byte
flipped in the middle, the whole file replaced by random bytes of the same
size, its header's version bumped: summary and query then exit 18 with one
line naming the file and the byte offset of the damaged chunk.  A file cut
mid-chunk stays readable, its counts those of the complete chunks: silently
when the tracer was killed (a partial trace), with one line saying what was
lost when the recording had ended.

Oracle: a naive walk of the container written here from the layout in
docs/trace-format.md (32-byte file header, then 16-byte chunk headers: magic, length,
checksum), independent of madtrace's reader; xxhash computes the checksums.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct

import numpy as np
import pytest
import xxhash

from madtrace.trace.capture_file import rebatch
from madtrace.trace.record_files import CALL_RECORDS
from madtrace.trace.format import RECORD_DTYPE

from .util import madtrace, prog

FILE_KINDS = {           # name: (engine, the file's path in the trace directory, a glob)
    "calls": ("fault", "calls/*.rec"),
    "accesses": ("fault", "data/*.acc"),
    "compact": ("hybrid", "data/*.dat"),
    "allocator calls": ("fault", "data/allocator_calls.bin"),
    "blocks": ("fault", "data/blocks.bin"),
    "block events": ("fault", "data/block_events.bin"),
}
# the files the summary reads (it counts from the raw files; the block events it
# takes from meta.json's counts): every file is read by the query (the store)
SUMMARY_READS = {"calls", "accesses", "compact", "allocator calls", "blocks"}


def naive_chunks(path) -> tuple[list[tuple[int, int]], int]:
    """(offset, payload length) of each complete chunk, and where they end."""
    data = open(path, "rb").read()
    assert data[:8] == b"MADTRACE"
    out, at = [], 32
    while at + 16 <= len(data):
        magic, length, check = struct.unpack_from("<IIQ", data, at)
        if magic != 0x4B43544D or at + 16 + length > len(data):
            break
        assert xxhash.xxh3_64_intdigest(data[at + 16:at + 16 + length], seed=length) == check
        out.append((at, length))
        at += 16 + length
    return out, at


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    base = tmp_path_factory.mktemp("capture")
    out = {}
    for engine in ("fault", "hybrid"):
        out[engine] = base / engine
        r = madtrace("record", "-q", "--data", "--data-engine", engine, "-o", str(out[engine]),
                     "--", prog("data_threads", "O0-pie"))
        assert r.returncode == 0, r.stderr
    return out


def copy_of(traces, kind, tmp_path):
    engine, pattern = FILE_KINDS[kind]
    directory = tmp_path / "t"
    shutil.copytree(traces[engine], directory)
    files = sorted(directory.glob(pattern), key=lambda p: -p.stat().st_size)
    assert files, pattern
    return directory, files[0]          # the largest file of the kind


def commands(directory, kind: str, query: str = "SELECT count(*) FROM calls") -> list[list[str]]:
    """The commands that read the file of ``kind``: the summary (SUMMARY_READS),
    the query (which builds the store)."""
    out = [["summary", str(directory)]] if kind in SUMMARY_READS else []
    return out + [["query", str(directory), query]]


def check_error(directory, needle: str, path, kind: str) -> None:
    """summary and query: exit 18, one line naming the file and ``needle``
    (besides the notice that the store is rebuilt), no traceback."""
    for args in commands(directory, kind):
        r = madtrace(*args)
        err = r.stderr.decode()
        assert r.returncode == 18, (args, r.returncode, err)
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.strip() and "building the store" not in line]
        assert len(lines) == 1, err
        assert lines[0].startswith(f"madtrace: {path}: ") and needle in lines[0], lines[0]


@pytest.mark.parametrize("kind", list(FILE_KINDS))
def test_a_byte_flipped_in_the_middle_is_named_with_its_chunk(traces, kind, tmp_path):
    directory, path = copy_of(traces, kind, tmp_path)
    chunks, end = naive_chunks(path)
    assert chunks and end == path.stat().st_size
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0x5A
    path.write_bytes(bytes(data))
    at = max(offset for offset, _ in chunks if offset <= middle)
    check_error(directory, f"at offset {at} ", path, kind)


@pytest.mark.parametrize("kind", list(FILE_KINDS))
def test_random_bytes_of_the_same_size_are_corrupt(traces, kind, tmp_path):
    directory, path = copy_of(traces, kind, tmp_path)
    path.write_bytes(random.Random(kind).randbytes(path.stat().st_size))
    check_error(directory, "at offset 0 ", path, kind)


@pytest.mark.parametrize("kind", list(FILE_KINDS))
def test_a_finished_trace_cut_mid_chunk_reads_its_complete_chunks(traces, kind, tmp_path):
    """A file cut short after the recording ended (a copy stopped half-way, a
    full disk): its complete chunks are read, and one line says what was lost."""
    directory, path = copy_of(traces, kind, tmp_path)
    shutil.rmtree(directory / "store", ignore_errors=True)
    chunks, _ = naive_chunks(path)
    offset, length = chunks[-1]
    with open(path, "r+b") as f:
        f.truncate(offset + 16 + length // 2)
    for args in commands(directory, kind, "SELECT count(*) AS n FROM records"):
        args = args + ["--json"] if args[0] == "query" else args
        r = madtrace(*args)
        err = r.stderr.decode()
        assert r.returncode == 0, (args, err)
        lines = [line for line in err.splitlines() if line.strip() and "building the store" not in line]
        # said once by each command that reads the raw files: the summary counts from
        # them, the query builds the store from them
        assert len(lines) == 1, err
        assert all(line.startswith(f"madtrace: {path}: truncated at offset {offset} ")
                   and "what followed is lost" in line for line in lines), lines
    if kind == "calls":     # the records are those of the complete chunks
        records = sum(n // 16 for rec in directory.glob("calls/*.rec") for _, n in naive_chunks(rec)[0])
        assert json.loads(r.stdout)[0]["n"] == records


@pytest.mark.parametrize("kind", list(FILE_KINDS))
def test_a_newer_version_is_named(traces, kind, tmp_path):
    directory, path = copy_of(traces, kind, tmp_path)
    data = bytearray(path.read_bytes())
    data[8] += 1                                  # the header's version (u16 at offset 8)
    path.write_bytes(bytes(data))
    check_error(directory, "unsupported capture format version 2 at offset 8", path, kind)


def test_a_killed_recording_cut_mid_chunk_is_partial(traces, tmp_path):
    """What a tracer killed mid-write leaves: meta.json still says "running",
    the last chunk of a call record file is cut short.  The trace is read
    (exit 0, partial), its calls those of the complete chunks."""
    directory = tmp_path / "t"
    shutil.copytree(traces["fault"], directory)
    shutil.rmtree(directory / "store", ignore_errors=True)
    meta = json.loads((directory / "meta.json").read_text())
    meta.update(outcome="running", tracer_pid=2**22 + 7)       # no such process
    (directory / "meta.json").write_text(json.dumps(meta))
    path = max(directory.glob("calls/*.rec"), key=lambda p: p.stat().st_size)
    chunks, _ = naive_chunks(path)
    offset, length = chunks[-1]
    with open(path, "r+b") as f:
        f.truncate(offset + 16 + length - 5)
    entries = 0
    for rec in directory.glob("calls/*.rec"):
        data = rec.read_bytes()
        for at, n in naive_chunks(rec)[0]:
            codes = np.frombuffer(data[at + 16:at + 16 + n], dtype=RECORD_DTYPE)["code"]
            entries += int(np.count_nonzero((codes & 1) == 0))
    r = madtrace("summary", str(directory), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["partial"] is True and summary["outcome"] == "tracer killed"
    assert sum(summary["calls"].values()) == entries
    q = madtrace("query", str(directory), "SELECT count(*) AS n FROM records", "--json")
    assert q.returncode == 0, q.stderr
    records = sum(n // 16 for rec in directory.glob("calls/*.rec") for _, n in naive_chunks(rec)[0])
    assert json.loads(q.stdout)[0]["n"] == records


def test_a_trace_of_an_older_madtrace_is_named(traces, tmp_path):
    directory = tmp_path / "t"
    shutil.copytree(traces["fault"], directory)
    meta = json.loads((directory / "meta.json").read_text())
    (directory / "meta.json").write_text(json.dumps(dict(meta, format_version=1)))
    r = madtrace("summary", str(directory))
    assert r.returncode == 18 and b"made by an older madtrace" in r.stderr, r.stderr
    assert len(r.stderr.decode().strip().splitlines()) == 1


def test_rows_read_by_range_and_in_chunks_match_what_was_written(tmp_path):
    """Many chunks of different sizes: every range and every chunk size reads
    back what was appended (a plain array as the oracle)."""
    rng = np.random.default_rng(5)
    rows = np.zeros(20_000, dtype=RECORD_DTYPE)
    rows["tsc"] = np.arange(len(rows))
    path = str(tmp_path / "calls" / "1.rec")
    os.makedirs(tmp_path / "calls")
    fd = CALL_RECORDS.create(path)
    at = 0
    while at < len(rows):
        n = int(rng.integers(1, 3000))
        CALL_RECORDS.append(fd, rows[at:at + n])
        at += n
    os.close(fd)
    assert CALL_RECORDS.rows(path) == len(rows)
    for start, count in ((0, -1), (0, 1), (17, 5000), (19_999, 10), (5000, 0), (12_345, 7_000)):
        expect = rows[start:] if count < 0 else rows[start:start + count]
        assert CALL_RECORDS.read(path, start, count).tobytes() == expect.tobytes()
    for chunk_rows in (1, 7, 1000, 1 << 20):
        parts = list(CALL_RECORDS.chunks(path, chunk_rows))
        assert all(len(p) <= chunk_rows for p in parts)
        assert np.concatenate(parts).tobytes() == rows.tobytes()
    assert [len(p) for p in rebatch([rows[:3], rows[3:10], rows[10:11]], 4)] == [3, 4, 4]


@pytest.mark.parametrize("name", ["maps.end.txt", "maps.start.txt"])
def test_a_memory_map_cut_short_is_read_up_to_the_cut(traces, tmp_path, name):
    """A saved memory map cut in the middle of a line: read up to its last whole
    line, and said (the mappings after it go unnamed)."""
    directory = tmp_path / "t"
    shutil.copytree(traces["fault"], directory)
    shutil.rmtree(directory / "store", ignore_errors=True)
    if name == "maps.start.txt":
        (directory / "maps.end.txt").unlink()       # the start map is read when no end map is
    text = (directory / name).read_text()
    cut = text.index("\n", len(text) // 2) + 6       # inside the line after the middle
    (directory / name).write_text(text[:cut])
    whole = text[:cut].count("\n")
    r = madtrace("summary", str(directory))
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.decode().splitlines() if "damaged at line" in line]
    assert said == [f"madtrace: {directory / name}: damaged at line {whole + 1} (cut short?): "
                    f"read up to there, the mappings after it go unnamed"], r.stderr
