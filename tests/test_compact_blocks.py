"""The blocks of data/<tid>.dat (trace/compact.py): written as byte planes
("MTZ2", by numpy or by the drain's C), read back record for record, and the
blocks written before (records as they are, "MTZ1") still read.  Oracle: the
records themselves."""

from __future__ import annotations

import os

import numpy as np
import pyarrow

from madtrace.data.records import _library
from madtrace.trace.compact import BLOCK_HEADER, CODEC, MAGIC, encode_block, iter_blocks, to_planes
from madtrace.trace.format import COMPACT_DTYPE
from madtrace.trace.record_files import COMPACT_RECORDS


def _records(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = np.zeros(n, dtype=COMPACT_DTYPE)
    r["a"] = 0x404000 + np.cumsum(rng.choice([0, 4, 8, 4096], n)) + rng.integers(0, 2**40) * (seed % 2)
    r["id"] = rng.integers(0, 5000, n)
    r["b"] = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    return r


def test_blocks_read_back_in_both_encodings(tmp_path):
    path = tmp_path / "1.dat"
    lib = _library()
    blocks = [_records(n, seed) for seed, n in enumerate((1, 2, 17, 1000, 65537))]
    container = COMPACT_RECORDS.container()
    fd = COMPACT_RECORDS.create(str(path))   # each block one chunk of the capture container
    try:
        for i, r in enumerate(blocks):
            if i == 2:               # an "MTZ1" block, as the tracer wrote them before
                packed = pyarrow.compress(r.tobytes(), codec=CODEC, asbytes=True)
                head = np.array([(MAGIC, r.nbytes, len(packed), len(r))], dtype=BLOCK_HEADER)
                container.append_payload(fd, head.tobytes() + packed)
            elif i % 2:              # planes made by the drain's C
                planes = np.empty(r.nbytes, dtype=np.uint8)
                lib.mt_compact_planes(r.ctypes.data, len(r), planes.ctypes.data)
                assert np.array_equal(planes, to_planes(r).reshape(-1))
                container.append_payload(fd, encode_block(r, planes))
            else:
                container.append_payload(fd, encode_block(r))
    finally:
        os.close(fd)
    got = [records for _offset, records in iter_blocks(str(path))]
    assert len(got) == len(blocks)
    for want, have in zip(blocks, got):
        assert np.array_equal(want, have)


def test_a_file_being_written_is_read_with_the_ids_appended_since(tmp_path):
    """A reader follows data/<tid>.dat while the tracer appends to it (a trace
    read while it is being recorded): a block naming an instruction id appended
    to data/instructions.jsonl after the reader loaded the table is decoded (the
    table is read again), not refused as an unknown id."""
    from madtrace.trace.compact import CompactReader, InstructionColumns, InstructionFile
    from madtrace.trace.record_files import ACCESS_RECORDS
    directory = str(tmp_path)
    os.makedirs(tmp_path / "data")
    table = InstructionFile(directory, 3)
    table.append([[0, 0, 0, 0, 0, 0], [0x401000, 4, 1, 3, 1, 0]])   # id 0: markers; 1: a load
    container = COMPACT_RECORDS.container()
    fd = COMPACT_RECORDS.create(ACCESS_RECORDS.compact_path(directory, 7))
    path = ACCESS_RECORDS.compact_path(directory, 7)
    reader = CompactReader(path, InstructionColumns.load(directory), directory)
    seen: list = []

    def count() -> int:          # the rows of the blocks written since the last call
        seen.extend(rows["seq"] for rows in reader.chunks())
        return sum(len(s) for s in seen)

    def block(ident: int, n: int) -> None:
        r = np.zeros(n, dtype=COMPACT_DTYPE)
        r["a"], r["id"] = 0x404000 + 8 * np.arange(n), ident
        container.append_payload(fd, encode_block(r))

    try:
        block(1, 5)
        assert count() == 5
        table.append([[0x401010, 8, 2, 4, 1, 0]])                     # id 2: a store, later
        block(2, 3)
        assert count() == 8
        assert np.array_equal(np.concatenate(seen), np.zeros(8, dtype=np.uint64))
    finally:
        os.close(fd)
        table.close()


def test_the_block_writer_appends_in_order_and_says_a_write_error(tmp_path):
    """The drain's blocks compressed and appended by the block writer's thread
    (data/block_writer.py): two files, blocks handed over faster than they are
    written (the drain waits when DEPTH wait), read back in order after
    ``flush``, each equal to what was handed over; a write that fails (the fd
    closed under it) is raised at the next flush, one line, no thread left."""
    import threading

    from madtrace.data.block_writer import BlockWriter
    from madtrace.errors import OutputError
    from madtrace.trace.capture_file import HEADER_SIZE

    lib = _library()
    writer = BlockWriter()
    paths = [str(tmp_path / f"{t}.dat") for t in (1, 2)]
    fds = [COMPACT_RECORDS.create(p) for p in paths]
    handed: list[list[np.ndarray]] = [[], []]
    try:
        for k in range(40):
            r = _records(1 + (k * 7919) % 5000, k)
            buf = writer.buffer(r.nbytes)
            planes = buf[:r.nbytes]
            lib.mt_compact_planes(r.ctypes.data, len(r), planes.ctypes.data)
            writer.submit(fds[k % 2], paths[k % 2], len(r), planes, buf)
            handed[k % 2].append(r)
        writer.flush()
        for path, want in zip(paths, handed):
            got = [records for _offset, records in iter_blocks(path)]
            assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(want, got))
        assert writer.bytes == sum(os.path.getsize(p) - HEADER_SIZE for p in paths)
    finally:
        for fd in fds:
            os.close(fd)
    r = _records(10, 99)
    buf = writer.buffer(r.nbytes)
    lib.mt_compact_planes(r.ctypes.data, len(r), buf.ctypes.data)
    writer.submit(fds[0], paths[0], len(r), buf[:r.nbytes], buf)       # a closed fd
    try:
        writer.close()
        raise AssertionError("the failed write was not said")
    except OutputError as exc:
        assert paths[0] in str(exc) and "\n" not in str(exc)
    assert not any(t.name == "madtrace-blocks" for t in threading.enumerate())



def test_the_block_writer_thread_leaves_when_idle_and_comes_back(tmp_path, monkeypatch):
    """The writer's thread leaves after IDLE seconds without a block and the next
    block starts another: blocks handed over around those moments (IDLE made
    short, pauses about as long) are all written, in order, and nothing waits
    for ever."""
    import random
    import time

    from madtrace.data import block_writer

    monkeypatch.setattr(block_writer, "IDLE", 0.002)
    lib = _library()
    writer = block_writer.BlockWriter()
    path = str(tmp_path / "1.dat")
    fd = COMPACT_RECORDS.create(path)
    rng = random.Random(5)
    handed = []
    try:
        for k in range(300):
            r = _records(1 + k % 50, k)
            buf = writer.buffer(r.nbytes)
            lib.mt_compact_planes(r.ctypes.data, len(r), buf.ctypes.data)
            writer.submit(fd, path, len(r), buf[:r.nbytes], buf)
            handed.append(r)
            if rng.random() < 0.3:
                time.sleep(rng.uniform(0, 0.004))
        writer.close()
    finally:
        os.close(fd)
    got = [records for _offset, records in iter_blocks(path)]
    assert len(got) == len(handed) and all(np.array_equal(a, b) for a, b in zip(handed, got))
