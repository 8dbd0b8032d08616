"""The tracer's side of the shared rings (layout: injector/layout.h).

``RingSet`` owns the shared area's control block, slot table and ring blocks:
it registers a thread (key = its fs base, as the trampolines look it up),
drains rings concurrently from a background thread with numpy (no per-event
Python work), appends each thread's records to ``calls/<tid>.rec`` in the
trace directory, counts entries per call site, and accounts for every record
that was dropped.  The target writes HEAD, the tracer writes TAIL; the
tracer only ever reads records below HEAD, which the target wrote before it
published HEAD (x86 stores are seen in order).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import threading

import numpy as np

from ..errors import TracerInternalError
from ..inject.templates import Injector

RECORD_DTYPE = np.dtype([("tsc", "<u8"), ("code", "<u4"), ("rsp", "<u4")])
TOMBSTONE = 1


class RingSet:
    def __init__(self, area, injector: Injector, out_dir: str):
        self.area = area              # SharedArea (control block + slot table + rings)
        self.L = injector
        self.mem = area.local
        self.out_dir = out_dir
        os.makedirs(os.path.join(out_dir, "calls"), exist_ok=True)
        self.lock = threading.Lock()
        self.free_rings = list(range(injector.MT_SLOTS))
        self.thread_ring: dict[int, int] = {}      # tid -> ring index
        self.thread_key: dict[int, int] = {}       # tid -> fs base
        self.files: dict[int, object] = {}         # tid -> open record file
        self.records_per_thread: dict[int, int] = {}
        self.entry_counts = np.zeros(1024, dtype=np.int64)
        self.dropped = 0
        self.exits_lost = 0
        self.unregistered_threads = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._base: int | None = None   # address of the tracer's mapping (head_address)
        self._u64(injector.MT_CTL_MAGIC, injector.MT_MAGIC)
        self._u64(injector.MT_CTL_VERSION, injector.MT_LAYOUT_VERSION)

    @classmethod
    def size_for(cls, injector: Injector) -> int:
        return injector.MT_RINGS + injector.MT_SLOTS * injector.MT_RING_BLOCK

    # ------------------------------------------------------------ raw access
    def _u64(self, offset: int, value: int | None = None) -> int:
        if value is None:
            return struct.unpack_from("<Q", self.mem, offset)[0]
        struct.pack_into("<Q", self.mem, offset, value)
        return value

    def ring_offset(self, index: int) -> int:
        return self.L.MT_RINGS + index * self.L.MT_RING_BLOCK

    @property
    def control_address(self) -> int:
        return self.area.address

    def set_enabled(self, enabled: bool) -> None:
        flags = self.mem[self.L.MT_CTL_FLAGS]
        flag = self.L.MT_FLAG_ENABLED
        self.mem[self.L.MT_CTL_FLAGS] = (flags | flag) if enabled else (flags & ~flag)

    # ---------------------------------------------------------- registration
    def register(self, tid: int, fs_base: int) -> None:
        if fs_base in (0, TOMBSTONE):
            self.unregistered_threads += 1
            return
        with self.lock:
            if tid in self.thread_ring:
                return
            if not self.free_rings:
                self.unregistered_threads += 1  # its records are counted as unregistered drops
                return
            index = self.free_rings.pop(0)
            ring = self.ring_offset(index)
            for field in ("MT_RING_HEAD", "MT_RING_DROPS", "MT_RING_SHADOW_TOP",
                          "MT_RING_EXITS_LOST", "MT_RING_TAIL_CACHE", "MT_RING_TAIL"):
                self._u64(ring + getattr(self.L, field), 0)
            self._u64(ring + self.L.MT_RING_TID, tid)
            slot = self._probe(fs_base, for_insert=True)
            # value before key: a concurrent lookup never sees a key without its ring
            self._u64(slot + 8, self.area.address + ring)
            self._u64(slot, fs_base)
            self.thread_ring[tid] = index
            self.thread_key[tid] = fs_base
            self.records_per_thread.setdefault(tid, 0)

    def _probe(self, key: int, for_insert: bool) -> int:
        L = self.L
        h = (key >> L.MT_SLOT_HASH_SHIFT) & (L.MT_SLOTS - 1)
        limit = L.MT_SLOT_TABLE_SIZE // L.MT_SLOT_ENTRY_SIZE
        for i in range(h, limit):
            off = L.MT_SLOT_TABLE + i * L.MT_SLOT_ENTRY_SIZE
            current = self._u64(off)
            if current == key or (for_insert and current in (0, TOMBSTONE)):
                return off
            if current == 0:
                break
        raise TracerInternalError(f"slot table: no entry for key {key:#x}")

    def unregister(self, tid: int) -> None:
        """At a thread's exit: drain its ring, free its slot (tombstone) and ring."""
        with self.lock:
            if tid not in self.thread_ring:
                return
            self._drain_one(tid)
            index = self.thread_ring.pop(tid)
            key = self.thread_key.pop(tid)
            ring = self.ring_offset(index)
            self.dropped += self._u64(ring + self.L.MT_RING_DROPS)
            self.exits_lost += self._u64(ring + self.L.MT_RING_EXITS_LOST)
            self._u64(self._probe(key, for_insert=False), TOMBSTONE)
            self.free_rings.append(index)
            f = self.files.pop(tid, None)
            if f:
                f.close()

    def head_address(self, tid: int) -> int:
        """The address of the thread's HEAD in the tracer's own memory (0: no ring)."""
        if tid not in self.thread_ring:
            return 0
        if self._base is None:
            self._base = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
        return self._base + self.ring_offset(self.thread_ring[tid]) + self.L.MT_RING_HEAD

    def head_of(self, tid: int) -> int:
        return self._u64(self.ring_offset(self.thread_ring[tid]) + self.L.MT_RING_HEAD)

    # ------------------------------------------------------------- draining
    def _drain_one(self, tid: int) -> int:
        L = self.L
        ring = self.ring_offset(self.thread_ring[tid])
        head = self._u64(ring + L.MT_RING_HEAD)
        tail = self._u64(ring + L.MT_RING_TAIL)
        n = head - tail
        if n <= 0:
            return 0
        if n > L.MT_RING_RECORDS:
            raise TracerInternalError(f"ring of thread {tid}: head {head} ahead of tail {tail} by {n}")
        base = ring + L.MT_RING_RECORDS_OFF
        start = tail & L.MT_RING_MASK
        first = min(n, L.MT_RING_RECORDS - start)
        f = self.files.get(tid)
        if f is None:
            f = self.files[tid] = open(os.path.join(self.out_dir, "calls", f"{tid}.rec"), "ab")
        # zero-copy views of the shared ring: counted, written out, then released
        for offset, count in ((start, first), (0, n - first)):
            if count:
                records = np.frombuffer(self.mem, dtype=RECORD_DTYPE, count=count,
                                        offset=base + offset * L.MT_RECORD_SIZE)
                self._count_entries(records["code"])
                f.write(records.data)
                del records
        # records are consumed: the target may overwrite them now
        self._u64(ring + L.MT_RING_TAIL, head)
        self.records_per_thread[tid] = self.records_per_thread.get(tid, 0) + n
        return n

    def _count_entries(self, codes: np.ndarray) -> None:
        entries = codes[(codes & self.L.MT_KIND_EXIT) == 0] >> 1
        if not len(entries):
            return
        top = int(entries.max())
        if top >= len(self.entry_counts):
            grown = np.zeros(max(top + 1, 2 * len(self.entry_counts)), dtype=np.int64)
            grown[:len(self.entry_counts)] = self.entry_counts
            self.entry_counts = grown
        self.entry_counts[:top + 1] += np.bincount(entries, minlength=top + 1)

    def drain_all(self) -> int:
        with self.lock:
            total = 0
            for tid in list(self.thread_ring):
                total += self._drain_one(tid)
            flags = self.mem[self.L.MT_CTL_FLAGS]
            if flags & self.L.MT_FLAG_NOWAIT:  # writers may wait again: we are alive
                self.mem[self.L.MT_CTL_FLAGS] = flags & ~self.L.MT_FLAG_NOWAIT
            return total

    @contextlib.contextmanager
    def quiesced(self):
        """Drain every ring and flush the record files; nothing more is drained
        until the block ends (a consistent copy of calls/ and of the counts)."""
        with self.lock:
            for tid in list(self.thread_ring):
                self._drain_one(tid)
            for f in self.files.values():
                f.flush()
            yield self

    def start(self, interval: float = 0.001) -> None:
        busy = self.L.MT_RING_RECORDS // 8

        def loop():
            idle = interval
            while not self._stop.is_set():
                moved = self.drain_all()
                if moved >= busy:
                    # a thread is producing fast: drain again soon, but not in a tight
                    # loop (each drain takes the ring's cache lines away from the writer)
                    self._stop.wait(0.0002)
                    continue
                idle = interval if moved else min(idle * 2, 0.004)
                self._stop.wait(idle)

        self._thread = threading.Thread(target=loop, name="madtrace-drain", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.drain_all()

    def totals(self) -> dict:
        """Drop accounting of every ring still registered plus those already released."""
        dropped, lost = self.dropped, self.exits_lost
        for index in self.thread_ring.values():
            ring = self.ring_offset(index)
            dropped += self._u64(ring + self.L.MT_RING_DROPS)
            lost += self._u64(ring + self.L.MT_RING_EXITS_LOST)
        return {"dropped": dropped, "exits_lost": lost,
                "unregistered_records": self._u64(self.L.MT_CTL_UNREGISTERED),
                "unregistered_threads": self.unregistered_threads}

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()
