# SPDX-License-Identifier: GPL-2.0-or-later
"""The drain of rings that hold data records and hook groups besides call
records (hybrid data engine): ring_drain.c ``mt_drain_ring_split``.

Call records go to the thread's record file, as for any ring; data records
and hook groups go to the data sink (data_records.py ``RingRecords``), a
batch at a time, each hook group with the number of data records before it
(the sink names those, applies the group, then names the rest).

Across threads, the order is the stamps' (hook_events.py): an allocator
call's return group carries a stamp, taken in the target with a lock xadd of
the control block's epoch, and every data record and entry group the epoch
it read.  A ring is drained up to its first record that needs a stamp not
taken yet (``next_stamp``, one for every ring): the ring holding that stamp
is drained first.  A stamp may sit in its own ring behind records that need
it (a signal handler interrupted the stub between its xadd and its publish,
and wrote records): ``drain_all`` then takes that group out of order (it is
made void in the ring).  A group that could not be written stops its stub at
a trap, and the tracer applies it (``apply_stamped``) with its stamp.  At the
end (``final``) everything left is taken, and a return group out of stamp
order is counted (``late``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import time

import numpy as np

from ..errors import OutputError, TracerInternalError
from ..trace.record_files import CALL_RECORDS

# ring_drain.c struct mt_data_out / struct mt_hook_out
DATA_OUT_DTYPE = np.dtype([("addr", "<u8"), ("seq", "<u8"), ("id", "<u4"), ("pad", "<u4")])
HOOK_OUT_DTYPE = np.dtype([("a0", "<u8"), ("a1", "<u8"), ("a2", "<u8"), ("ret", "<u8"),
                           ("seq", "<u8"), ("data_before", "<u8"), ("position", "<u8"),
                           ("code", "<u4"), ("stamp", "<u4"), ("rsp", "<u4"), ("flags", "<u4")])
DATA_OUT_ROWS = 1 << 16
HOOK_OUT_ROWS = 4096


def create_file(path: str) -> int:
    """calls/<tid>.rec opened for appending chunks, its header written if it is new."""
    try:
        return CALL_RECORDS.create(path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None

PASSES = 256            # drain passes over the rings while stamps unblock records (each
#                         pass takes at least one stamp: threads' stamps interleave)
STAMP_WAIT = 2.0        # seconds the tracer waits for an earlier stamp (apply_stamped)
STALLED = 2
LATE = 1                # ring_drain.c MT_HOOK_OUT_LATE


class SplitState(ctypes.Structure):
    """ring_drain.c struct mt_split."""
    _fields_ = [("calls", ctypes.c_uint64), ("out", ctypes.c_void_p),
                ("out_cap", ctypes.c_uint64), ("out_n", ctypes.c_uint64),
                ("hooks", ctypes.c_void_p), ("hooks_cap", ctypes.c_uint64),
                ("hooks_n", ctypes.c_uint64), ("damaged", ctypes.c_uint64),
                ("late", ctypes.c_uint64), ("next_stamp", ctypes.c_uint32),
                ("final", ctypes.c_uint32)]


def declare(lib) -> None:
    """The splitter's functions of libmtdrain.so (rings.py loads it)."""
    U64, P = ctypes.c_uint64, ctypes.c_void_p
    lib.mt_drain_ring_split.restype = ctypes.c_int
    lib.mt_drain_ring_split.argtypes = [P, ctypes.c_int, P, U64, U64, ctypes.c_int,
                                        ctypes.POINTER(U64), ctypes.POINTER(SplitState)]
    lib.mt_ring_take_stamp.restype = ctypes.c_int
    lib.mt_ring_take_stamp.argtypes = [P, ctypes.c_uint32, U64, P]
    lib.mt_ring_pending_calls.restype, lib.mt_ring_pending_calls.argtypes = U64, [P]
    lib.mt_epoch_take.restype, lib.mt_epoch_take.argtypes = ctypes.c_uint32, [P]
    for name in ("mt_drain_data_out_size", "mt_drain_hook_out_size", "mt_drain_split_size"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = U64, []
    if (lib.mt_drain_data_out_size(), lib.mt_drain_hook_out_size(), lib.mt_drain_split_size()) != \
            (DATA_OUT_DTYPE.itemsize, HOOK_OUT_DTYPE.itemsize, ctypes.sizeof(SplitState)):
        raise TracerInternalError("libmtdrain.so does not match ring_split.py: run `make native`")


class RingSplitter:
    def __init__(self, rings, sink):
        """``rings``: the RingSet (its lock held by every caller); ``sink(tid, data,
        hooks)``: a batch of data records (DATA_OUT_DTYPE) and hook groups
        (HOOK_OUT_DTYPE), in order, used before the next call only."""
        self.rings = rings
        self.sink = sink
        self.lib = rings.lib
        self.state = SplitState()
        self._data = np.zeros(DATA_OUT_ROWS, dtype=DATA_OUT_DTYPE)
        self._hooks = np.zeros(HOOK_OUT_ROWS, dtype=HOOK_OUT_DTYPE)
        self._group = np.zeros(1, dtype=HOOK_OUT_DTYPE)
        self.state.out, self.state.out_cap = self._data.ctypes.data, DATA_OUT_ROWS
        self.state.hooks, self.state.hooks_cap = self._hooks.ctypes.data, HOOK_OUT_ROWS
        self._moved = ctypes.c_uint64()
        self.stalled: set[int] = set()        # threads whose ring waits for a stamp
        self.out_of_order = 0                 # groups taken ahead of their ring (see above)
        self.stamp_waits = 0                  # synchronous groups that waited for a stamp
        self.stamps_late = 0                  # ... that gave up waiting
        self.applied: set[int] = set()        # stamps applied ahead of next_stamp (late)

    @property
    def next_stamp(self) -> int:
        return self.state.next_stamp

    @property
    def damaged(self) -> int:
        return self.state.damaged

    @property
    def late(self) -> int:
        return self.state.late + self.stamps_late

    def epoch_address(self) -> int:
        """Where the control block's epoch is in the tracer."""
        return ctypes.addressof(ctypes.c_char.from_buffer(self.rings.mem)) + \
            self.rings.L.MT_CTL_EPOCH

    # ------------------------------------------------------------ draining
    def drain(self, tid: int) -> int:
        """The thread's ring, as far as the stamps allow (``stalled`` says if not all)."""
        rings = self.rings
        counts = rings.code_counts
        first = 2 * rings.L.MT_COUNTED_SITES
        state = self.state
        total = 0
        self.stalled.discard(tid)
        while True:
            state.calls = rings.records_per_thread.get(tid, 0)
            state.out_n = state.hooks_n = 0
            err = self.lib.mt_drain_ring_split(
                rings.ring_local(rings.thread_ring[tid]), rings.files.get(tid, -1),
                counts.ctypes.data, first, first + len(counts) - 1, int(rings.recording(tid)),
                self._moved, ctypes.byref(state))
            total += self._moved.value
            rings.records_per_thread[tid] = state.calls
            if state.hooks_n and state.final:
                hooks = self._hooks[:state.hooks_n]
                # returns taken out of stamp order (the end, a thread's exit): the drain
                # steps over their stamps when it gets there
                self.applied.update(hooks["stamp"][(hooks["flags"] & LATE) != 0].tolist())
            if state.out_n or state.hooks_n:
                self.sink(tid, self._data[:state.out_n], self._hooks[:state.hooks_n])
            path = CALL_RECORDS.path(rings.out_dir, tid)
            if err == -errno.ENOENT:
                rings.files[tid] = create_file(path)
                continue
            if err == 1:
                continue
            if err == STALLED:
                self.stalled.add(tid)
                return total
            if err == -errno.EPROTO:
                raise TracerInternalError(f"ring of thread {tid}: head more than one ring ahead")
            if err:
                raise OutputError(f"cannot write {path}: {os.strerror(-err)}")
            return total

    def drain_all(self) -> int:
        """Every ring, again while a stamp that unblocks records comes out."""
        rings = self.rings
        total = 0
        for _ in range(PASSES):
            self._skip_applied()
            moved = sum(rings.drain_one(tid) for tid in list(rings.thread_ring))
            total += moved
            if not self.stalled:
                break
            # a pass that moved nothing: no ring has next_stamp in front; a ring that
            # holds it behind records waiting for it gives it up now (see the module)
            if not moved and not self._take_waiting_stamp():
                break
        return total

    def _take_waiting_stamp(self) -> bool:
        """The return group of ``next_stamp``, if one ring holds it behind records
        that wait for it (see the module): taken now, out of its ring's order."""
        rings = self.rings
        for tid, index in list(rings.thread_ring.items()):
            calls = rings.records_per_thread.get(tid, 0)
            if self.lib.mt_ring_take_stamp(rings.ring_local(index), self.state.next_stamp,
                                           calls, self._group.ctypes.data):
                self.state.next_stamp += 1
                self.out_of_order += 1
                self.sink(tid, self._data[:0], self._group)   # before the records it unblocks
                return True
        return False

    def _skip_applied(self) -> None:
        state = self.state
        while state.next_stamp in self.applied:
            self.applied.discard(state.next_stamp)
            state.next_stamp = (state.next_stamp + 1) & 0xFFFFFFFF

    def pending_calls(self, tid: int) -> int:
        """Call records of the thread still in its ring (behind a stalled record)."""
        rings = self.rings
        if tid not in self.stalled or tid not in rings.thread_ring:
            return 0
        return self.lib.mt_ring_pending_calls(rings.ring_local(rings.thread_ring[tid]))

    def finish(self) -> None:
        """No stamp is coming any more (the end): what the stamps order is taken in
        their order, then every record left, whatever stamp it waits for (``late``)."""
        self.drain_all()
        self.state.final = 1

    # ------------------------------------------------------ synchronous groups
    def take_stamp(self) -> int:
        """A stamp of the tracer's own (for a group whose stub took none)."""
        return self.lib.mt_epoch_take(self.epoch_address())

    def apply_stamped(self, stamp: int, apply) -> None:
        """``apply()`` a return group with this stamp that the tracer took from a
        stopped thread: once every earlier stamp is applied (other threads' groups,
        drained meanwhile), then the stamps move past it."""
        state = self.state
        deadline = None
        self.drain_all()
        while state.next_stamp != stamp and not state.final and \
                ((stamp - state.next_stamp) & 0xFFFFFFFF) < 1 << 31:
            if deadline is None:
                self.stamp_waits += 1
                deadline = time.monotonic() + STAMP_WAIT
            if time.monotonic() > deadline:
                self.stamps_late += 1      # the thread holding an earlier stamp is stopped
                break
            if not self.drain_all():
                time.sleep(0.0005)
        apply()
        if state.next_stamp == stamp:
            state.next_stamp = (stamp + 1) & 0xFFFFFFFF
        elif not state.final:
            self.applied.add(stamp)        # the drain steps over it when it gets there
        self.drain_all()

    def report(self) -> dict:
        return {"next_stamp": int(self.state.next_stamp), "damaged_records": int(self.damaged),
                "taken_out_of_order": self.out_of_order, "late": int(self.late),
                "stamp_waits": self.stamp_waits}
