# SPDX-License-Identifier: GPL-2.0-or-later
"""The drain of the function-tracing rings (madtrace/rings/ring_drain.c),
on ring blocks laid out here as the trampolines lay them out (injector/
layout.h): what it appends to the record file, the TAIL and LIMIT it
publishes, the entry records it counts for sites without a counter in the
ring, and what it does when HEAD is impossible or the file cannot take the
records.

Oracle: the records put into the ring, kept aside in order (a naive copy),
and a plain count of their codes.  The calls of the sites that do have a
counter are counted by the trampolines themselves: tests/test_calls.py
checks those against callgrind.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys

import numpy as np

from madtrace.rings.rings import _library
from madtrace.target.templates import load_injector
from madtrace.trace.capture_file import HEADER_SIZE
from madtrace.trace.record_files import CALL_RECORDS
from madtrace.trace.format import CHUNK_HEADER, RECORD_DTYPE

from .util import ROOT

L = load_injector()
RECORDS = L.MT_RING_RECORDS


class Ring:
    """One ring block in this process's memory, and the records written so far."""

    def __init__(self, start: int = 0):
        self.block = np.zeros(L.MT_RING_BLOCK, dtype=np.uint8)
        self.address = self.block.ctypes.data
        self.written = []          # every record, in order (the oracle)
        self.set(L.MT_RING_HEAD, start)
        self.set(L.MT_RING_TAIL, start)
        self.set(L.MT_RING_LIMIT, start + RECORDS)

    def get(self, offset: int) -> int:
        return int(self.block[offset:offset + 8].view(np.uint64)[0])

    def set(self, offset: int, value: int) -> None:
        self.block[offset:offset + 8].view(np.uint64)[0] = value

    def write(self, codes) -> None:
        """Records with these codes, as a writer would: at HEAD, then HEAD moves."""
        head = self.get(L.MT_RING_HEAD)
        records = self.block[L.MT_RING_RECORDS_OFF:L.MT_RING_RECORDS_OFF + RECORDS * 16].view(
            RECORD_DTYPE)
        for i, code in enumerate(codes):
            index = (head + i) & L.MT_RING_MASK
            records[index] = (head + i, code, 0x7ff0 + i % 7)
            self.written.append(records[index].tobytes())
        self.set(L.MT_RING_HEAD, head + len(codes))

    def drain(self, fd: int, counts: np.ndarray, first: int, recording: bool = True):
        moved = ctypes.c_uint64()
        err = _library().mt_drain_ring(self.address, fd, counts.ctypes.data, first,
                                       first + len(counts) - 1, int(recording), moved)
        return err, moved.value


def test_records_go_out_in_order_across_the_end_of_the_ring(tmp_path):
    ring = Ring(start=RECORDS - 1000)      # the ring's end is 1000 records away
    path = tmp_path / "t.rec"
    fd = CALL_RECORDS.create(str(path))
    counts = np.zeros(1, dtype=np.uint64)  # no code counted (first >= last)
    codes = [(i % 5) << 1 | (i & 1) for i in range(150_000)]   # more than two 1 MiB pieces
    ring.write(codes[:100_000])
    assert ring.drain(fd, counts, first=1 << 40) == (0, 100_000)
    assert ring.get(L.MT_RING_TAIL) == RECORDS + 99_000
    assert ring.get(L.MT_RING_LIMIT) == 2 * RECORDS + 99_000
    ring.write(codes[100_000:])
    assert ring.drain(fd, counts, first=1 << 40) == (0, 50_000)
    assert ring.drain(fd, counts, first=1 << 40) == (0, 0)        # nothing new
    os.close(fd)
    assert CALL_RECORDS.read(str(path)).tobytes() == b"".join(ring.written)   # chunks checked
    # one chunk per piece: up to the ring's end, then 1 MiB pieces
    assert len(CALL_RECORDS.container().index(str(path)).offsets) == 4
    assert counts[0] == 0


def test_sites_without_a_counter_are_counted_by_code(tmp_path):
    first = 2 * L.MT_COUNTED_SITES            # the first code the drain counts
    ring = Ring()
    codes = [3, 4, first, first + 1, first + 2, first, first + 7, first + 900, 2]
    ring.write(codes)
    counts = np.zeros(8 + 1, dtype=np.uint64)    # codes first..first+7, then unknown ones
    fd = CALL_RECORDS.create(str(tmp_path / "t.rec"))
    assert ring.drain(fd, counts, first=first) == (0, len(codes))
    os.close(fd)
    expected = np.zeros(9, dtype=np.uint64)
    for code in codes:
        if code >= first:
            expected[min(code - first, 8)] += 1
    assert counts.tolist() == expected.tolist() == [2, 1, 1, 0, 0, 0, 0, 1, 1]


def test_limit_stays_zero_while_not_recording(tmp_path):
    ring = Ring()
    ring.write([0, 1])
    ring.set(L.MT_RING_LIMIT, 0)          # recording off
    fd = CALL_RECORDS.create(str(tmp_path / "t.rec"))
    assert ring.drain(fd, np.zeros(1, dtype=np.uint64), first=1 << 40, recording=False) == (0, 2)
    os.close(fd)
    assert ring.get(L.MT_RING_TAIL) == 2 and ring.get(L.MT_RING_LIMIT) == 0


def test_head_beyond_one_ring_consumes_nothing(tmp_path):
    ring = Ring()
    ring.set(L.MT_RING_HEAD, RECORDS + 1)
    fd = CALL_RECORDS.create(str(tmp_path / "t.rec"))
    assert ring.drain(fd, np.zeros(1, dtype=np.uint64), first=1 << 40) == (-errno.EPROTO, 0)
    os.close(fd)
    assert ring.get(L.MT_RING_TAIL) == 0 and CALL_RECORDS.rows(str(tmp_path / "t.rec")) == 0


def test_a_file_that_cannot_take_the_records_consumes_nothing(tmp_path):
    ring = Ring()
    ring.write([0, 1, 2])
    fd = os.open(tmp_path / "t.rec", os.O_RDONLY | os.O_CREAT)
    assert ring.drain(fd, np.zeros(1, dtype=np.uint64), first=1 << 40) == (-errno.EBADF, 0)
    os.close(fd)
    assert ring.get(L.MT_RING_TAIL) == 0


SIZE_LIMITED = """
import os, resource, signal
import numpy as np
from madtrace.trace.record_files import CALL_RECORDS
from tests.test_ring_drain import L, Ring
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
fd = CALL_RECORDS.create({path!r})
ring = Ring()
ring.write(list(range(3000)))
first = ring.drain(fd, np.zeros(1, dtype=np.uint64), first=1 << 40)
resource.setrlimit(resource.RLIMIT_FSIZE, (100_008, 100_008))  # the next chunk does not fit
ring.write(list(range(20_000)))
print(*first, *ring.drain(fd, np.zeros(1, dtype=np.uint64), first=1 << 40), ring.get(L.MT_RING_TAIL))
"""


def test_a_full_file_keeps_whole_chunks_and_consumes_them_only(tmp_path):
    """The write stops at a file size limit halfway through a chunk: the part
    written is cut off again, nothing of that chunk is consumed, and the file
    still reads back whole (its earlier chunk, checked)."""
    path = tmp_path / "t.rec"
    script = SIZE_LIMITED.format(path=str(path))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    err0, moved0, err, moved, tail = map(int, r.stdout.split())
    assert (err0, moved0) == (0, 3000)
    assert (err, moved, tail) == (-errno.EFBIG, 0, 3000)
    assert os.path.getsize(path) == HEADER_SIZE + CHUNK_HEADER.itemsize + 3000 * 16
    assert CALL_RECORDS.read(str(path))["tsc"].tolist() == list(range(3000))


def test_layout_of_a_ring_block():
    """The counters (one per counted site, then the spare one) lie after the
    records, inside the block; the block is whole pages (rings are mapped and
    populated page by page)."""
    records_end = L.MT_RING_RECORDS_OFF + L.MT_RECORD_SIZE * RECORDS
    assert records_end <= L.MT_RING_COUNTS
    assert L.MT_RING_COUNTS + 8 * (L.MT_COUNTED_SITES + 1) <= L.MT_RING_BLOCK
    assert L.MT_RING_BLOCK % 4096 == 0 and L.MT_RING_RECORDS_OFF % 4096 == 0
    assert L.MT_RING_COUNTS % 4096 != L.MT_RING_HEAD % 4096
    assert _library().mt_drain_ring_block() == L.MT_RING_BLOCK


# --------------------------------------------- the hybrid engine's split drain
# (ring_split.py, ring_drain.c mt_drain_ring_split): call records to the file,
# data records and hook groups out, the groups' stamps ordering the threads


def put(ring: Ring, rows: list[tuple[int, int, int]]) -> None:
    """Raw records {u64 a, u32 code, u32 hi} at HEAD, published together."""
    head = ring.get(L.MT_RING_HEAD)
    records = ring.block[L.MT_RING_RECORDS_OFF:L.MT_RING_RECORDS_OFF + RECORDS * 16].view(
        [("a", "<u8"), ("code", "<u4"), ("hi", "<u4")])
    for i, row in enumerate(rows):
        records[(head + i) & L.MT_RING_MASK] = row
    ring.set(L.MT_RING_HEAD, head + len(rows))


def data(address: int, ident: int, epoch: int):
    return (address, L.MT_DATA_CODE | ident, epoch)


def entry(ring: Ring, hook: int, a0: int, rsp: int, epoch: int, at: int | None = None):
    """The four records of an entry group, as the stubs write them at ring index ``at``."""
    at = ring.get(L.MT_RING_HEAD) if at is None else at
    cont = L.MT_HOOK_CONT
    return [(a0, L.MT_HOOK_CODE | hook << 2 | L.MT_HOOK_ENTRY, epoch), (a0 + 1, cont, at & 0xFFFFFFFF),
            (a0 + 2, cont, rsp), (0x401000, cont, 0)]


def ret(ring: Ring, hook: int, result: int, rsp: int, stamp: int):
    at = ring.get(L.MT_RING_HEAD)
    return [(result, L.MT_HOOK_CODE | hook << 2 | L.MT_HOOK_RETURN, stamp),
            (rsp, L.MT_HOOK_CONT, at & 0xFFFFFFFF)]


class Rings:
    """Two threads' rings behind a RingSplitter, as rings.py drives it."""

    def __init__(self, tmp_path):
        from madtrace.rings.ring_split import RingSplitter
        self.rings = {1: Ring(), 2: Ring()}
        self.out: list[tuple] = []          # (tid, "data", address) / (tid, "hook", code, stamp)
        fake = type("FakeRingSet", (), {})()
        fake.lib = _library()
        fake.code_counts = np.zeros(1, dtype=np.uint64)
        fake.L = L
        fake.enabled = True
        fake.recording = lambda tid: True
        fake.out_dir = str(tmp_path)
        fake.files = {tid: CALL_RECORDS.create(str(tmp_path / f"{tid}.rec")) for tid in (1, 2)}
        fake.records_per_thread = {}
        fake.thread_ring = {1: 1, 2: 2}
        fake.ring_local = lambda index: self.rings[index].address
        fake.drain_one = lambda tid: self.splitter.drain(tid)
        fake.mem = bytearray(4096)
        self.splitter = RingSplitter(fake, self.sink)

    def sink(self, tid, out, hooks):
        rows = [(int(d["addr"]), "data") for d in out]
        for h in hooks:
            rows.insert(int(h["data_before"]) + sum(1 for r in rows[:int(h["data_before"])]
                                                     if r[1] == "hook"),
                        (int(h["code"]), "hook", int(h["stamp"])))
        self.out += [(tid, *r) for r in rows]


def test_split_drain_orders_accesses_after_the_stamps_before_them(tmp_path):
    """Thread 1 frees a block (return group, stamp 0); thread 2's access that read
    epoch 1 (after that free) waits for it, even though thread 2's ring is drained
    first; an access of epoch 0 does not wait."""
    r = Rings(tmp_path)
    one, two = r.rings[1], r.rings[2]
    put(two, [data(0x5000, 7, 0), data(0x5008, 7, 1), (11, 3, 0)])   # ..., then a call record
    put(one, entry(one, 2, 0x5000, 0x7000, 0))
    put(one, [data(0x5010, 8, 0)])
    put(one, ret(one, 2, 0, 0x7000, 0))
    r.splitter.drain(2)
    assert r.out == [(2, 0x5000, "data")] and 2 in r.splitter.stalled
    r.splitter.drain(1)
    assert r.splitter.next_stamp == 1
    r.splitter.drain(2)
    assert [row[1:] for row in r.out] == [
        (0x5000, "data"), (L.MT_HOOK_CODE | 2 << 2 | L.MT_HOOK_ENTRY, "hook", 0),
        (0x5010, "data"), (L.MT_HOOK_CODE | 2 << 2 | L.MT_HOOK_RETURN, "hook", 0),
        (0x5008, "data")]
    assert not r.splitter.stalled and r.splitter.damaged == 0
    assert CALL_RECORDS.rows(str(tmp_path / "2.rec")) == 1     # the call record went out


def test_split_drain_takes_a_stamp_held_behind_records_that_wait_for_it(tmp_path):
    """A signal handler's records (epoch 2) came between thread 1's stamp 1 and its
    publication: the drain takes stamp 1 out of the ring's order, then the rest."""
    r = Rings(tmp_path)
    one = r.rings[1]
    put(one, ret(one, 3, 0x6000, 0x7000, 0))
    put(one, [data(0x6000, 9, 2)])                 # the handler's access
    put(one, ret(one, 3, 0x6100, 0x6f00, 1))       # published after the handler returned
    r.splitter.drain_all()
    codes = [(row[1], row[2]) for row in r.out]
    assert codes == [(L.MT_HOOK_CODE | 3 << 2 | 1, "hook"), (L.MT_HOOK_CODE | 3 << 2 | 1, "hook"),
                     (0x6000, "data")]
    assert r.splitter.out_of_order == 1 and r.splitter.next_stamp == 2 and not r.splitter.stalled


def test_split_drain_skips_a_broken_group(tmp_path):
    """A group whose first record a signal handler's record overwrote: its
    continuation records are skipped and counted, the records around it kept."""
    r = Rings(tmp_path)
    one = r.rings[1]
    group = entry(one, 1, 0x5000, 0x7000, 0)
    group[0] = data(0x5100, 4, 0)                  # overwritten by a probe's record
    put(one, group + [data(0x5200, 4, 0)])
    r.splitter.drain(1)
    assert [row[1] for row in r.out] == [0x5100, 0x5200]
    assert r.splitter.damaged == 3
