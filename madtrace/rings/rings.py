# SPDX-License-Identifier: GPL-2.0-or-later
"""The tracer's side of the shared rings (layout: injector/layout.h).

``RingSet`` owns the control area (control block, slot table) and the ring
blocks, mapped a chunk of MT_RINGS_PER_CHUNK at a time as threads need them
(a ring given back at a thread's exit serves the next thread): it registers a thread (key = NOT its fs base, as the trampolines look it up),
drains rings concurrently from a background thread, appends each thread's
records to ``calls/<tid>.rec`` in the trace directory, sums the threads' call
counters, and accounts for every record that was dropped.  The target writes
HEAD and its counters; the tracer writes TAIL and LIMIT (TAIL + ring size
while recording, 0 while not), the one value the writer tests.  The tracer
only ever reads records below HEAD, which the target wrote before it
published HEAD (x86 stores are seen in order).

The drain and the writing are threads of C (rings/drain_thread.c, through
rings/native_drain.py), which never wait for the GIL: this class tells them
which ring goes to which file; Python takes a ring itself only where its owner
changed (ring_pool.py), or for the hybrid data engine's rings (ring_split.py).
No per-record work in Python.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import struct
import threading
from typing import Callable

import numpy as np

from ..errors import OutputError, TracerInternalError
from ..target.templates import Injector
from ..native import load
from .drain_loop import DrainLoop
from .native_drain import NativeDrain
from .native_drain import declare as declare_native
from .slot_table import SlotTable
from ..trace.record_files import CALL_RECORDS
from ..trace.format import CALLS_DIR, CAPTURE_FORMAT_VERSION, CHUNK_HEADER, RECORD_DTYPE
from .ring_split import RingSplitter
from .ring_split import declare as declare_split

KEY_MASK = (1 << 64) - 1
ALL_RECORDS = (1 << 64) - 1     # drain_records: no record is left
MADV_POPULATE_WRITE = 23   # Linux 5.14


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = load("libmtdrain.so", "the ring drain", use_errno=True)
    U64 = ctypes.c_uint64
    for name in ("mt_drain_record_size", "mt_drain_ring_block",
                 "mt_drain_capture_version", "mt_drain_chunk_header_size"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = U64, []
    lib.madvise.restype = ctypes.c_int
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.mt_drain_ring.restype = ctypes.c_int
    lib.mt_drain_ring.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, U64, U64,
                                  ctypes.c_int, ctypes.POINTER(U64)]
    lib.mt_drain_ring_upto.restype = ctypes.c_int
    lib.mt_drain_ring_upto.argtypes = lib.mt_drain_ring.argtypes + [U64]
    declare_native(lib)
    lib.mt_slot_cas.restype = lib.mt_word_cas.restype = ctypes.c_int
    lib.mt_slot_cas.argtypes = [ctypes.c_void_p, U64, U64, U64, U64]
    lib.mt_word_cas.argtypes = [ctypes.c_void_p, U64, U64]
    declare_split(lib)
    if lib.mt_drain_record_size() != RECORD_DTYPE.itemsize:
        raise TracerInternalError("libmtdrain.so does not match RECORD_DTYPE: rebuild it")
    if lib.mt_drain_capture_version() != CAPTURE_FORMAT_VERSION or \
            lib.mt_drain_chunk_header_size() != CHUNK_HEADER.itemsize:
        raise TracerInternalError("libmtdrain.so does not match the capture container of "
                                  "trace/format.py: run `make native`")
    return lib


def _check_build(lib, injector: Injector) -> None:
    if lib.mt_drain_ring_block() != injector.MT_RING_BLOCK:
        raise TracerInternalError("libmtdrain.so and the injector disagree on the layout: "
                                  "run `make native injector`")


class RingSet:
    def __init__(self, area, injector: Injector, out_dir: str, map_chunk=None):
        """``area``: the control area (control block + slot table); ``map_chunk(size)``
        maps a new area of ``size`` bytes for ring blocks in the target (a
        SharedArea; it needs a stopped thread) when the threads need more rings."""
        self.area = area              # SharedArea: control block + slot table
        self.L = injector
        self.mem = area.local
        self.out_dir = out_dir
        self._map_chunk = map_chunk
        os.makedirs(os.path.join(out_dir, CALLS_DIR), exist_ok=True)
        self.lock = threading.RLock()
        self.chunks: list = []                     # SharedArea of MT_RINGS_PER_CHUNK ring blocks
        self._chunk_local: list[int] = []          # their addresses in the tracer
        self.free_rings: list[int] = []
        self.populated: set[int] = set()           # rings whose record pages exist
        # rings registered while an attached target waits: populated after (~1 ms each)
        self.defer_populate = False
        self.pending_populate: list[int] = []
        self.thread_ring: dict[int, int] = {}      # tid -> ring index
        self.thread_key: dict[int, int] = {}       # tid -> slot table key
        self.files: dict[int, int] = {}            # tid -> record file descriptor
        self.records_per_thread: dict[int, int] = {}
        # the most records waiting in each thread's ring at a drain (``take_peaks``)
        self.peak_used: dict[int, int] = {}
        # Calls per site: each thread's trampolines count them in its ring block
        # (MT_RING_COUNTS, sites below MT_COUNTED_SITES); a ring given back adds its
        # counters to ``released_counts``.  The drain counts the records of further
        # sites, by code (site id << 1 | MT_KIND_EXIT) from 2 * MT_COUNTED_SITES on,
        # into ``code_counts``, whose last counter takes codes of no known site (none:
        # the trampolines only write codes of the plan's sites).
        self.sites = 0
        self.released_counts = np.zeros(0, dtype=np.uint64)
        self.code_counts = np.zeros(1, dtype=np.uint64)
        self.enabled = False
        self.muted: set[int] = set()      # threads whose records are off for a while (``mute``)
        # where a thread's owner word is, from its thread pointer (layout.h "Ring
        # pool"); each ring holds its thread's, and each lookup compares them
        self.owner_offset = 0
        # the ring pool (rings/ring_pool.py), while threads may claim rings
        self.pool = None
        self.lib = _library()
        _check_build(self.lib, injector)
        self.slots = SlotTable(self.mem, injector, self.lib)
        # the records on their way to calls/<tid>.rec (the C threads)
        self.spill = NativeDrain(self.lib, self._mem_address() + injector.MT_CTL_NOWAIT,
                                 injector.MT_SLOTS)
        self.spill.set_counts(self.code_counts, 2 * injector.MT_COUNTED_SITES)
        self.dropped = 0
        self.exits_lost = 0
        self.waits = 0
        self.unregistered_threads = 0
        self.unregistered_records = 0
        self.closed = False
        # the drain's write error (OutputError): recording stopped there; on_failure(exc)
        # is called from the drain thread (say it at once; no ptrace from there)
        self.failure: OutputError | TracerInternalError | None = None
        self.on_failure = None
        self._loop: DrainLoop | None = None
        # the hybrid data engine's rings hold data records and hook groups too: they
        # go to the splitter's sink (``data_sink``, ring_split.py); None: none
        self.splitter: RingSplitter | None = None
        self.control_u64(injector.MT_CTL_MAGIC, injector.MT_MAGIC)
        self.control_u64(injector.MT_CTL_VERSION, injector.MT_LAYOUT_VERSION)

    @property
    def data_sink(self) -> Callable | None:
        return self.splitter.sink if self.splitter is not None else None

    @data_sink.setter
    def data_sink(self, sink: Callable[[int, np.ndarray, np.ndarray], None]) -> None:
        """``sink(tid, data records, hook groups)``, in order (ring_split.py)."""
        with self.lock:
            self.spill.set_active(False)    # the splitter takes every ring from now on
            self.collect()
            self.spill.flush()        # the splitter appends to the same files, after them
            self.splitter = RingSplitter(self, sink)

    @classmethod
    def size_for(cls, injector: Injector) -> int:
        """Bytes of the control area."""
        return injector.MT_CONTROL_AREA

    @classmethod
    def chunk_size(cls, injector: Injector) -> int:
        return injector.MT_RINGS_PER_CHUNK * injector.MT_RING_BLOCK

    # ------------------------------------------------------------ raw access
    def _mem_address(self) -> int:
        return ctypes.addressof(ctypes.c_char.from_buffer(self.mem))

    def control_u64(self, offset: int, value: int | None = None) -> int:
        if value is None:
            return struct.unpack_from("<Q", self.mem, offset)[0]
        struct.pack_into("<Q", self.mem, offset, value)
        return value

    def ring_memory(self, index: int) -> tuple:
        """(the chunk's local mapping, the ring's offset in it)."""
        chunk, slot = divmod(index, self.L.MT_RINGS_PER_CHUNK)
        return self.chunks[chunk].local, slot * self.L.MT_RING_BLOCK

    def ring_u64(self, index: int, field: int, value: int | None = None) -> int:
        mem, offset = self.ring_memory(index)
        if value is None:
            return struct.unpack_from("<Q", mem, offset + field)[0]
        struct.pack_into("<Q", mem, offset + field, value)
        return value

    def ring_address(self, index: int) -> int:
        """Where ring block ``index`` is in the target."""
        chunk, slot = divmod(index, self.L.MT_RINGS_PER_CHUNK)
        return self.chunks[chunk].address + slot * self.L.MT_RING_BLOCK

    def ring_local(self, index: int) -> int:
        """Where ring block ``index`` is in the tracer."""
        chunk, slot = divmod(index, self.L.MT_RINGS_PER_CHUNK)
        return self._chunk_local[chunk] + slot * self.L.MT_RING_BLOCK

    @property
    def control_address(self) -> int:
        return self.area.address

    @property
    def capacity(self) -> int:
        return len(self.chunks) * self.L.MT_RINGS_PER_CHUNK

    def ensure_free(self, n: int) -> None:
        """At least ``n`` free rings (more chunks mapped in the target if needed, up to
        MT_SLOTS rings in all)."""
        with self.lock:
            while len(self.free_rings) < n and self.capacity < self.L.MT_SLOTS:
                chunk = self._map_chunk(self.chunk_size(self.L))
                first = self.capacity
                self.chunks.append(chunk)
                self._chunk_local.append(ctypes.addressof(ctypes.c_char.from_buffer(chunk.local)))
                per = min(self.L.MT_RINGS_PER_CHUNK, self.L.MT_SLOTS - first)
                self.free_rings.extend(range(first, first + per))

    def set_enabled(self, enabled: bool) -> None:
        """Recording on or off: the flag (for threads without a ring) and every
        ring's LIMIT (the writers' one test)."""
        with self.lock:
            self.enabled = enabled
            # a writer waiting on a full ring waits while this process lives (layout.h)
            self.control_u64(self.L.MT_CTL_DRAINER, os.getpid() if enabled else 0)
            flags = self.mem[self.L.MT_CTL_FLAGS]
            flag = self.L.MT_FLAG_ENABLED
            self.mem[self.L.MT_CTL_FLAGS] = (flags | flag) if enabled else (flags & ~flag)
            for index in self.thread_ring.values():
                self._set_limit(index)
            for index in self.pool.rings_placed() if self.pool is not None else ():
                self._set_limit(index)

    def _set_limit(self, index: int, recording: bool | None = None) -> None:
        on = self.enabled if recording is None else recording
        self.spill.set_limit(index, self.ring_local(index), on)   # between two takes

    def recording(self, tid: int) -> bool:
        return self.enabled and tid not in self.muted

    @contextlib.contextmanager
    def mute(self, tid: int):
        """No record from ``tid`` while the block runs (its ring's LIMIT is 0, which
        the writers read as recording off: nothing written, nothing dropped): the
        tracer's own calls in the target (registering unwind information) are not
        the program's."""
        index = self.thread_ring.get(tid)
        if index is None:
            yield
            return
        with self.lock:
            self.muted.add(tid)
            self._set_limit(index, False)
        try:
            yield
        finally:
            with self.lock:
                self.muted.discard(tid)
                if tid in self.thread_ring:
                    self._set_limit(self.thread_ring[tid])

    def reserve_sites(self, n: int) -> None:
        """Room to count the calls of sites 0..n-1 (before they are patched)."""
        with self.lock:
            if n <= self.sites:
                return
            counted = min(n, self.L.MT_COUNTED_SITES)
            released = np.zeros(counted, dtype=np.uint64)
            released[:len(self.released_counts)] = self.released_counts
            self.released_counts = released
            codes = np.zeros(2 * (n - counted) + 1, dtype=np.uint64)
            with self.spill.held():         # no take counts meanwhile
                codes[:len(self.code_counts) - 1] = self.code_counts[:-1]
                codes[-1] = self.code_counts[-1]
                self.code_counts = codes
                self.spill.set_counts(codes, 2 * self.L.MT_COUNTED_SITES)
            self.sites = n

    def counter_offset(self, sid: int) -> int:
        """Where the trampolines of site ``sid`` count its calls, from a ring block's start."""
        return self.L.MT_RING_COUNTS + 8 * min(sid, self.L.MT_COUNTED_SITES)

    def _counters(self, index: int) -> np.ndarray:
        """The thread counters of ring ``index`` (a view of the shared area: del it soon)."""
        mem, offset = self.ring_memory(index)
        return np.frombuffer(mem, dtype=np.uint64, count=len(self.released_counts),
                             offset=offset + self.L.MT_RING_COUNTS)

    @property
    def entry_counts(self) -> np.ndarray:
        """Calls (entry records) per site id so far: every thread's counters."""
        with self.lock:
            counts = np.zeros(self.sites, dtype=np.uint64)
            counted = len(self.released_counts)
            counts[:counted] = self.released_counts
            for index in self.thread_ring.values():
                view = self._counters(index)
                counts[:counted] += view
                del view
            counts[counted:] = self.code_counts[:-1:2]
            return counts

    # ---------------------------------------------------------- registration
    def register(self, tid: int, fs_base: int, owner: int = 0) -> None:
        """Gives thread ``tid`` a ring, found by its fs base (0: it has none), and
        owned by its owner word ``owner``.  A thread without a ring writes no
        record: its records are counted as dropped."""
        if fs_base == 0:
            self.unregistered_threads += 1
            return
        key = ~fs_base & KEY_MASK   # as the trampolines look it up (layout.h)
        with self.lock:
            if tid in self.thread_ring:
                return
            if key in self.thread_key.values():
                self.unregistered_threads += 1  # its records are counted as unregistered drops
                return
            self.ensure_free(1)
            if not self.free_rings:
                self.unregistered_threads += 1
                return
            index = self.free_rings.pop(0)
            self.reset(index)
            self.ring_u64(index, self.L.MT_RING_TID, tid)
            self.ring_u64(index, self.L.MT_RING_OWNER, owner)
            (self.pending_populate.append if self.defer_populate else self._populate)(index)
            if not self.slots.insert(key, self.ring_address(index)):
                self.free_rings.insert(0, index)
                self.unregistered_threads += 1
                return
            self.adopt(tid, index, key)

    def reset(self, index: int) -> None:
        """A ring as a new thread finds it: empty, no owner, recording as the rest."""
        for field in ("MT_RING_HEAD", "MT_RING_DROPS", "MT_RING_SHADOW_TOP", "MT_RING_EXITS_LOST",
                      "MT_RING_WAITS", "MT_RING_TAIL", "MT_RING_OWNER", "MT_RING_TID",
                      "MT_RING_KEY", "MT_RING_OWNERS_W", "MT_RING_OWNERS_R"):
            self.ring_u64(index, getattr(self.L, field), 0)
        self._set_limit(index)
        self.ring_u64(index, self.L.MT_RING_CONTROL, self.area.address)

    def adopt(self, tid: int, index: int, key: int = 0) -> None:
        """Ring ``index`` is thread ``tid``'s (``key``: its slot key, 0: the one the
        thread wrote in the ring, read when it is given back)."""
        with self.lock:
            if tid in self.thread_ring:       # a dead thread's id, given again
                self.unregister(tid)
            self.thread_ring[tid] = index
            self.thread_key[tid] = key
            self.records_per_thread.setdefault(tid, 0)
            self.spill.set_ring(index, self.ring_local(index), CALL_RECORDS.path(self.out_dir, tid),
                                self.recording(tid))

    def records_range(self, tid: int) -> tuple[int, int]:
        """(address in the target, size) of the thread's records."""
        return (self.ring_address(self.thread_ring[tid]) + self.L.MT_RING_RECORDS_OFF,
                self.L.MT_RING_RECORDS * self.L.MT_RECORD_SIZE)

    def _populate(self, index: int) -> None:
        """Allocates the pages of a ring's records now (in the tracer: the target
        then only maps them), so that the thread does not take a page fault and
        a page allocation every 128 calls of its first 131072 calls; once per
        ring (a ring given back keeps its pages for its next thread).  Best
        effort: an older kernel (EINVAL) leaves them to the first touch."""
        if index in self.populated:
            return
        self.populated.add(index)
        self.lib.madvise(self.ring_local(index) + self.L.MT_RING_RECORDS_OFF,
                          self.L.MT_RING_RECORDS * self.L.MT_RECORD_SIZE, MADV_POPULATE_WRITE)

    def populate_pending(self) -> list[tuple[int, int]]:
        """The rings ``_populate`` left for later (``defer_populate``): populated now;
        the target's ranges of their records."""
        with self.lock:
            pending, self.pending_populate = self.pending_populate, []
            for index in pending:
                self._populate(index)
            return [(self.ring_address(i) + self.L.MT_RING_RECORDS_OFF,
                     self.L.MT_RING_RECORDS * self.L.MT_RECORD_SIZE) for i in pending]

    def unregister(self, tid: int) -> None:
        """At a thread's exit: drain its ring, free its slot (tombstone) and ring."""
        with self.lock:
            if tid not in self.thread_ring or self.closed:
                return
            if self.splitter is not None:
                self.splitter.drain_all()     # the stamps its records wait for, first
            self.drain_one(tid)
            if tid not in self.thread_ring:
                return              # its ring was taken over: the new owner's now
            if self.splitter is not None and tid in self.splitter.stalled:
                final = self.splitter.state.final     # its ring goes: what waits goes now
                self.splitter.state.final = 1
                self.drain_one(tid)
                self.splitter.state.final = final
            with self.spill.held():         # no take between the count and the end
                self.collect()
                index = self.thread_ring.pop(tid)
                self.spill.clear_ring(index)
            key = self.thread_key.pop(tid) or self.ring_u64(index, self.L.MT_RING_KEY)
            self._fold(index, clear=True)
            if key:
                self.slots.remove(key, self.ring_address(index))
            self.free_rings.append(index)
            fd = self.files.pop(tid, None)
            if fd is not None:
                os.close(fd)
            self.spill.close_file(CALL_RECORDS.path(self.out_dir, tid))

    def _fold(self, index: int, clear: bool) -> None:
        """A ring's counters and drop counts into the totals of released rings."""
        view = self._counters(index)    # the thread is gone: its counters stay still
        self.released_counts += view
        if clear:
            view[:] = 0                  # for the ring's next thread
        del view
        L = self.L
        self.dropped += self.ring_u64(index, L.MT_RING_DROPS)
        self.exits_lost += self.ring_u64(index, L.MT_RING_EXITS_LOST)
        self.waits += self.ring_u64(index, L.MT_RING_WAITS)

    def head_address(self, tid: int) -> int:
        """The address of the thread's HEAD in the tracer's own memory (0: no ring)."""
        if tid not in self.thread_ring or self.closed:
            return 0
        return self.ring_local(self.thread_ring[tid]) + self.L.MT_RING_HEAD

    def head_of(self, tid: int) -> int:
        return self.ring_u64(self.thread_ring[tid], self.L.MT_RING_HEAD)

    def fill(self) -> dict[int, float]:
        """How full each thread's ring is now (records written, not yet drained)."""
        L = self.L
        with self.lock:
            return {tid: (self.ring_u64(i, L.MT_RING_HEAD) - self.ring_u64(i, L.MT_RING_TAIL))
                    / L.MT_RING_RECORDS for tid, i in self.thread_ring.items()}

    def take_peaks(self) -> dict[int, float]:
        """How full each thread's ring was at its fullest drain since the last call."""
        with self.lock:
            peaks, self.peak_used = self.peak_used, {}
        return {tid: used / self.L.MT_RING_RECORDS for tid, used in peaks.items()}

    # ------------------------------------------------------------- draining
    def _drain_one(self, tid: int) -> int:
        if self.splitter is not None:
            return self.splitter.drain(tid)
        if self.pool is not None:   # a ring taken over by another thread: each its records
            return self.pool.drain(tid)
        return self.drain_records(tid)

    def drain_records(self, tid: int, upto: int = ALL_RECORDS) -> int:
        """The records of ``tid``'s ring below record number ``upto``, taken out for its
        file now (as many as may wait for the disk); counted by ``collect``."""
        return self.spill.take(self.thread_ring[tid], upto)

    def collect(self) -> int:
        """The records the takes moved since the last call, each ring's to its thread
        (called before a ring changes hands)."""
        moved, peak = self.spill.collect()
        total = int(moved.sum())
        for tid, index in self.thread_ring.items():
            if moved[index]:
                self.records_per_thread[tid] = self.records_per_thread.get(tid, 0) + \
                    int(moved[index])
            if peak[index] > self.peak_used.get(tid, 0):
                self.peak_used[tid] = int(peak[index])
        return total

    def drain_all(self, background: bool = False) -> int:
        """Every ring now (``background``: the drain loop's pass, which leaves the
        rings to the C thread while it runs); the records moved since the last call."""
        with self.lock:
            if self.closed:
                return 0
            if self.pool is not None:
                self.pool.service()     # rings claimed meanwhile are drained too
            total = 0
            if self.splitter is not None:
                total = self.splitter.drain_all()
            else:
                if self.pool is not None:
                    self.pool.hand_overs()   # rings whose owner changed: up to each change
                if not (background and self.spill.active):
                    self.spill.pass_now()
            # writers may wait again: we are alive (each pass in C says so itself)
            if self.splitter is not None and self.mem[self.L.MT_CTL_NOWAIT]:
                self.mem[self.L.MT_CTL_NOWAIT] = 0
            self._spill_failed()
            return total + self.collect()

    def drain_one(self, tid: int) -> int:
        """Drains the thread's ring; a write error (the disk is full, or gone)
        stops recording instead of raising, in whichever thread meets it (the
        tracer's main thread may be in the middle of a stop): ``failure``."""
        with self.lock:
            self._spill_failed()
            if self.closed or self.failure is not None or tid not in self.thread_ring:
                return 0
            try:
                return self._drain_one(tid)
            except OutputError as exc:
                self.fail(exc)
                return 0

    def fail(self, exc: OutputError | TracerInternalError) -> None:
        """Recording stops, so no writer ever waits for a drain; the session
        reports it (exit 23) at its end."""
        self.failure = exc
        self.set_enabled(False)
        if self.on_failure is not None:
            self.on_failure(exc)

    def _spill_failed(self) -> None:
        """A write error of the writer thread, or a failed pass of the drain thread,
        stops recording (said once)."""
        with self.lock:
            if self.failure is None and not self.closed:
                failure = self.spill.error or self.spill.failure()
                if failure is not None:
                    self.fail(failure)

    @contextlib.contextmanager
    def quiesced(self):
        """Drain every ring and flush the record files; nothing more is drained
        until the block ends (a consistent copy of calls/ and of the counts)."""
        with self.lock:
            self.drain_all()
            self.spill.flush()
            yield self

    def start(self) -> None:
        """Drains in the background: the C thread, and the loop that looks after the
        pool and the splitter (rings/drain_loop.py)."""
        if self.splitter is None:
            self.spill.start()
        self._loop = DrainLoop(self)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.stop()
        self.spill.stop()
        if self.splitter is not None:
            with self.lock:
                self.splitter.finish()    # the last drain: no stamp is coming any more
        self.drain_all()
        self.spill.flush()
        self._spill_failed()

    def totals(self) -> dict:
        """Drop accounting of every ring still registered plus those already released;
        ``ring_waits``: records that found their ring full and waited for the drain."""
        dropped, lost, waits = self.dropped, self.exits_lost, self.waits
        with self.lock:
            for index in self.thread_ring.values():
                dropped += self.ring_u64(index, self.L.MT_RING_DROPS)
                lost += self.ring_u64(index, self.L.MT_RING_EXITS_LOST)
                waits += self.ring_u64(index, self.L.MT_RING_WAITS)
            unregistered = self.unregistered_records if self.closed else \
                self.control_u64(self.L.MT_CTL_UNREGISTERED)
        return {"dropped": dropped, "exits_lost": lost, "ring_waits": waits,
                "unregistered_records": unregistered,
                "unregistered_threads": self.unregistered_threads}

    def close(self) -> None:
        """The end of the recording (drained, nothing writes any more): the counts
        and drops are kept, the record files closed and the tracer's mappings
        of the rings let go (the target's are MadtraceAreas')."""
        with self.lock:
            if self.closed:
                return
            if self.pool is not None:
                self.pool.adopt()      # a ring claimed since the last drain: its counters too
                self.pool.close()
            for index in self.thread_ring.values():
                self._fold(index, clear=False)
            self.thread_ring.clear()
            self.thread_key.clear()
            self.spill.close()         # every record written, the files closed
            self._spill_failed()
            self.unregistered_records = self.control_u64(self.L.MT_CTL_UNREGISTERED)
            self.closed = True
            for fd in self.files.values():
                os.close(fd)
            self.files.clear()
            for chunk in self.chunks:
                chunk.close_local()
            self.area.close_local()
