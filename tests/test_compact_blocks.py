"""The blocks of data/<tid>.dat (trace/compact.py): written as byte planes
("MTZ2", by numpy or by the drain's C), read back record for record, and the
blocks written before (records as they are, "MTZ1") still read.  Oracle: the
records themselves."""

from __future__ import annotations

import os

import numpy as np
import pyarrow

from madtrace.capture.data_records import _library
from madtrace.trace.compact import BLOCK_HEADER, CODEC, MAGIC, encode_block, iter_blocks, to_planes
from madtrace.trace.format import COMPACT_DTYPE, COMPACT_RECORDS


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
