"""capture/record_spill.py: the buffers between the rings and calls/<tid>.rec.
A take gets a buffer of the next power of two, one written before when there
is one (its pages allocated already: a new buffer's are zeroed by the kernel at
the first write, a third of the drain's CPU on a first burst); the bound on
what waits for the disk counts those buffers' bytes, not the records in them."""

from __future__ import annotations

import numpy as np

from madtrace.capture.record_spill import KEEP, SMALL, RecordSpill
from madtrace.capture.rings import _library
from madtrace.trace.format import CALL_RECORDS, RECORD_DTYPE

RING = 4 << 20


def _records(n: int) -> np.ndarray:
    rows = np.zeros(n, dtype=RECORD_DTYPE)
    rows.view(np.uint64)[::2] = np.arange(n, dtype=np.uint64)     # each record's first word
    return rows.view(np.uint8)


def test_a_written_buffer_serves_the_next_take_of_its_size(tmp_path):
    spill = RecordSpill(_library(), RING)
    path = str(tmp_path / "1.rec")
    sent = []
    first = None
    for n in (6000, 5000, 7000):            # 96, 80, 112 KB: each in a 128 KB buffer
        buffer = spill.buffer(n * RECORD_DTYPE.itemsize)
        assert len(buffer) == 128 << 10
        if first is None:
            first = buffer
        else:
            assert buffer is first          # the same buffer: its pages exist
        rows = _records(n)
        buffer[:len(rows)] = rows
        sent.append(rows)
        spill.put(path, buffer, len(rows))
        spill.flush()
        assert spill.pending == 0
    spill.stop()
    got = CALL_RECORDS.read(path)
    assert got.tobytes() == b"".join(r.tobytes() for r in sent)
    assert len(spill.buffer(SMALL - 16)) == SMALL - 16      # a small take: a buffer of its own


def test_the_bound_counts_buffers_and_kept_buffers_are_bounded(tmp_path):
    spill = RecordSpill(_library(), RING, limit=1 << 20)
    record = RECORD_DTYPE.itemsize
    assert spill.room(record) == (1 << 20) // record
    buffer = spill.buffer(100 << 10)        # 100 KB of records in a 128 KB buffer
    spill.pending += len(buffer)            # as put() counts it, the writer not started
    assert spill.room(record) == ((1 << 20) - (128 << 10)) // record
    spill.pending -= len(buffer)
    # written buffers beyond KEEP bytes are let go
    held = [spill.buffer(RING) for _ in range(KEEP // RING + 2)]
    path = str(tmp_path / "2.rec")
    for buffer in held:
        spill.put(path, buffer, 16)
    spill.flush()
    spill.stop()
    assert 0 < spill._kept <= KEEP
    assert sum(len(b) for kept in spill._free.values() for b in kept) == spill._kept
