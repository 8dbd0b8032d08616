"""rings/native_drain.py and drain_thread.c: the C threads between the rings
and calls/<tid>.rec, on ring blocks laid out as the target's (here in the
tracer's own memory): records taken in order, TAIL and LIMIT published, a
file opened only at its first records, a ring whose owner changed left to
Python, the bound on what waits for the disk, and a write error said."""

from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np
import pytest

from madtrace.rings.native_drain import NativeDrain
from madtrace.rings.rings import _library
from madtrace.errors import OutputError
from madtrace.target.templates import load_injector
from madtrace.trace.record_files import CALL_RECORDS
from madtrace.trace.format import RECORD_DTYPE

L = load_injector()


class Ring:
    """A ring block in this process, written as a trampoline would."""

    def __init__(self):
        self.mem = np.zeros(L.MT_RING_BLOCK, dtype=np.uint8)
        self.address = self.mem.ctypes.data
        self.words = self.mem.view(np.uint64)
        self.written = 0

    def u64(self, field: int, value: int | None = None) -> int:
        if value is not None:
            self.words[field // 8] = value
        return int(self.words[field // 8])

    def write(self, n: int) -> np.ndarray:
        """n records after those written, their first word numbering them; HEAD moved."""
        rows = np.zeros(n, dtype=RECORD_DTYPE)
        rows.view(np.uint64)[::2] = np.arange(self.written, self.written + n, dtype=np.uint64)
        raw = rows.view(np.uint8)
        for i in range(n):     # ring order (wraps)
            at = L.MT_RING_RECORDS_OFF + ((self.written + i) % L.MT_RING_RECORDS) * 16
            self.mem[at:at + 16] = raw[16 * i:16 * i + 16]
        self.written += n
        self.u64(L.MT_RING_HEAD, self.written)
        return rows


@pytest.fixture
def drain():
    nowait = ctypes.c_uint8(1)
    d = NativeDrain(_library(), ctypes.addressof(nowait), L.MT_SLOTS)
    d.nowait = nowait
    d.set_counts(np.zeros(1, dtype=np.uint64), 1 << 40)   # no code counted
    yield d
    d.close()


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_the_thread_takes_each_rings_records_in_order_and_publishes_tail(drain, tmp_path):
    rings, paths, sent = [Ring(), Ring()], [str(tmp_path / "1.rec"), str(tmp_path / "2.rec")], [[], []]
    for i, ring in enumerate(rings):
        drain.set_ring(i, ring.address, paths[i], True)
    drain.start()
    for burst in range(6):
        for i, ring in enumerate(rings):
            sent[i].append(ring.write(5000 + 3000 * i + burst))
        _wait(lambda: all(r.u64(L.MT_RING_TAIL) == r.written for r in rings))
    assert drain.nowait.value == 0                      # the writers may wait again
    for ring in rings:
        assert ring.u64(L.MT_RING_LIMIT) == ring.written + L.MT_RING_RECORDS
    drain.stop()
    drain.flush()
    moved, _ = drain.collect()
    assert moved[:2].tolist() == [r.written for r in rings]
    for i in range(2):
        assert CALL_RECORDS.read(paths[i]).tobytes() == b"".join(r.tobytes() for r in sent[i])


def test_a_file_is_opened_at_its_first_records_and_closed_after_them(drain, tmp_path):
    ring, path = Ring(), str(tmp_path / "3.rec")
    drain.set_ring(0, ring.address, path, True)
    assert drain.pass_now() == 0
    drain.flush()
    assert not os.path.exists(path)                    # no record: no file
    rows = ring.write(100)
    assert drain.pass_now() == 100
    drain.clear_ring(0)
    drain.close_file(path)
    drain.flush()
    assert CALL_RECORDS.read(path).tobytes() == rows.tobytes()
    assert not [fd for fd in os.listdir("/proc/self/fd")
                if os.path.realpath(f"/proc/self/fd/{fd}") == path]


def test_a_ring_whose_owner_changed_is_left_to_python_up_to_the_change(drain, tmp_path):
    ring, path = Ring(), str(tmp_path / "4.rec")
    drain.set_ring(0, ring.address, path, True)
    first = ring.write(300)
    ring.u64(L.MT_RING_OWNERS_W, 1)                    # a thread took the ring over at 300
    ring.write(200)
    assert drain.pass_now() == 0                       # the thread must not guess the files
    assert drain.take(0, 300) == 300                   # Python: up to the change
    assert ring.u64(L.MT_RING_TAIL) == 300
    drain.flush()
    assert CALL_RECORDS.read(path).tobytes() == first.tobytes()


def test_what_waits_for_the_disk_is_bounded(tmp_path):
    """The writer stuck on a file (a FIFO nobody reads yet): takes stop at the bound,
    and go on, in order, once the disk (here the reader) catches up."""
    nowait = ctypes.c_uint8(0)
    limit = 1 << 20
    drain = NativeDrain(_library(), ctypes.addressof(nowait), L.MT_SLOTS, limit=limit)
    drain.set_counts(np.zeros(1, dtype=np.uint64), 1 << 40)
    path = str(tmp_path / "5.rec")
    os.mkfifo(path)
    got = bytearray()
    reader = threading.Thread(target=lambda: got.extend(open(path, "rb").read()))
    ring = Ring()
    drain.set_ring(0, ring.address, path, True)
    sent = [ring.write(30000)]                        # 480 KB
    assert drain.pass_now() == 30000
    sent.append(ring.write(60000))                    # 960 KB: 512 KB of room left
    moved = drain.pass_now()
    assert 0 < moved < 60000 and drain.pending <= limit
    assert drain.pass_now() == 0                      # the bound: nothing more
    reader.start()                                    # the disk catches up
    _wait(lambda: drain.pass_now() == 0 and ring.u64(L.MT_RING_TAIL) == ring.written)
    drain.clear_ring(0)
    drain.close()
    reader.join()
    copy = tmp_path / "copy.rec"
    copy.write_bytes(bytes(got))
    assert CALL_RECORDS.read(str(copy)).tobytes() == b"".join(r.tobytes() for r in sent)


def test_a_write_error_is_said_with_its_file(drain, tmp_path):
    ring, path = Ring(), str(tmp_path / "missing" / "6.rec")
    drain.set_ring(0, ring.address, path, True)
    ring.write(10)
    assert drain.pass_now() == 10
    drain.flush()
    error = drain.error
    assert isinstance(error, OutputError) and path in str(error)


def _thread_named(name: str) -> int | None:
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().strip() == name:
                return int(tid)
    return None


def test_the_writer_leaves_the_cpu_to_the_drain(drain):
    """The threads are named (top -H, perf), and the writer runs at a lower priority
    than the drain: a burst waits in buffers, not in the program's ring."""
    drain.start()
    _wait(lambda: _thread_named("madtrace-drain") and _thread_named("madtrace-write"))
    drain_nice = os.getpriority(os.PRIO_PROCESS, _thread_named("madtrace-drain"))
    writer_nice = os.getpriority(os.PRIO_PROCESS, _thread_named("madtrace-write"))
    assert writer_nice == min(drain_nice + 5, 19)
    drain.stop()
    assert _thread_named("madtrace-drain") is None
