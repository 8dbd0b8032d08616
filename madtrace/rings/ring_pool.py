# SPDX-License-Identifier: GPL-2.0-or-later
"""The tracer's side of the ring pool (layout.h "Ring pool").

In a live session, a thread created while functions are instrumented is not
traced and never waits for the tracer: its first record takes a ring
(mt_claim, in the target), the ring of the dead thread whose TCB glibc gave
it (taken over in place), or one from the pool.  ``RingPool`` keeps the
pool's entries filled with empty rings, adopts each claimed ring (the entry
holds the claiming thread's id; its records go to ``calls/<tid>.rec`` as any
thread's), follows the owners of a ring taken over (``drain``: each owner's
records to its own file), and takes a claimed ring back once its thread is
gone: the owner word in the thread's TCB (the thread pointer is NOT the
ring's key) is no longer the thread's id (the kernel clears it at the
thread's end; glibc then marks it, or gives the TCB to a new thread), or
cannot be read (the stack was unmapped).  It waits REAP_DELAY before: the
next thread of that TCB then takes the ring over without the tracer.  Its
records are drained and its counters folded first: every call stays
counted.

It also keeps the requests of untraced threads about to fork or exec (the
MT_CTL_SEIZE entries, written by mt_seizeme): the run loop seizes them
(``requests``, ``seized``), so that the fork or exec is seen as a traced
thread's.

Everything here runs under the RingSet's lock: in the drain thread
(``service``, before each drain) or in the tracer's thread.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Callable

from ..trace.record_files import CALL_RECORDS

REAP_INTERVAL = 0.005     # s between two looks at the claiming threads' owner words
# s a ring of a dead thread stays as it is, while the pool has rings: the next thread
# glibc gives that thread's TCB takes it over (no pool ring, no race with the tracer)
REAP_DELAY = 0.1
RESERVE = 4               # free rings kept beyond the pool's, before asking for more
TID_LIMIT = 1 << 32       # a pool entry below this (and not 0) holds a thread id


class RingPool:
    def __init__(self, rings, pid: int):
        self.rings = rings
        self.L = L = rings.L
        self.pid = pid
        self.placed: list[int | None] = [None] * L.MT_POOL_ENTRIES   # ring index in each entry
        self.claimed: set[int] = set()      # threads whose ring came from the pool
        self.active = False
        self.claims = 0            # rings taken by threads
        self.taken_back = 0        # rings given back at their thread's end
        self.taken_over = 0        # rings taken over by the next thread of their TCB
        self.found_empty = 0       # times a thread found the pool empty (its records dropped)
        self.seize_requests = 0    # untraced threads seized before a fork or an exec
        self.need_rings = False    # fewer free rings than RESERVE: map more (a stop)
        self.growth_stops = 0      # stops of the traced threads to map more rings
        # called (from the drain thread) when the run loop has work: a thread waits to
        # be seized, or rings are needed
        self.on_work: Callable[[], None] | None = None
        self._last_reap = 0.0
        self._dead_since: dict[int, float] = {}    # claimed threads seen gone, since when
        self._mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    # ------------------------------------------------------------ control block
    def _ctl(self, offset: int, value: int | None = None) -> int:
        return self.rings.control_u64(offset, value)

    def _entry(self, i: int) -> int:
        return self.L.MT_CTL_POOL + 8 * i

    def start(self, owner_offset: int, tracer_tid: int) -> None:
        """Threads without a ring take one from now on (every thread stopped, or not:
        the flag is the last word written)."""
        L = self.L
        with self.rings.lock:
            self._ctl(L.MT_CTL_PID, self.pid)
            self._ctl(L.MT_CTL_OWNER_OFF, owner_offset)
            self._ctl(L.MT_CTL_TRACER, tracer_tid)
            self.rings.pool = self
            self.fill()
            self.active = True
            self.rings.mem[L.MT_CTL_FLAGS] |= L.MT_FLAG_POOL

    def stop(self) -> None:
        """No thread takes a ring from now on (those taken stay theirs); the rings
        left in the pool go back to the free ones, as do those of threads that
        ended (no slot of a dead thread stays for a new one to find: every
        thread is traced from its creation from now on, and gets its ring from
        the tracer)."""
        L = self.L
        with self.rings.lock:
            self.active = False
            self.rings.mem[L.MT_CTL_FLAGS] &= ~L.MT_FLAG_POOL & 0xFF
            for i, index in enumerate(self.placed):
                if index is None:
                    continue
                address = self.rings.ring_address(index)
                if self.rings.slots.cas(self._entry(i), address, 0):
                    self.placed[i] = None
                    self.rings.free_rings.append(index)
            self.adopt()        # an entry that held a thread id meanwhile
            self.reap(now_all=True)

    def rings_placed(self) -> list[int]:
        return [index for index in self.placed if index is not None]

    # ------------------------------------------------------------------ work
    def service(self) -> None:
        """Before each drain: adopt the rings claimed since, take back those of
        threads that ended, fill the pool again; tell the run loop of work."""
        L = self.L
        self.adopt()
        empty = self.rings.mem[L.MT_CTL_POOL_EMPTY]
        now = time.monotonic()
        if empty or now - self._last_reap >= REAP_INTERVAL or self.need_rings:
            self.reap()
            self._last_reap = now
        if empty:
            self.found_empty += 1
            self.rings.mem[L.MT_CTL_POOL_EMPTY] = 0
        if self.active:
            self.fill()
        if self.on_work is not None and (self.need_rings or self.requests()):
            self.on_work()

    def fill(self) -> None:
        """Every empty entry gets a free ring, reset (recording as the others)."""
        rings = self.rings
        for i in range(self.L.MT_POOL_ENTRIES):
            if self.placed[i] is not None or self._ctl(self._entry(i)) != 0:
                continue
            if not rings.free_rings:
                break
            index = rings.free_rings.pop(0)
            rings.reset(index)
            self.placed[i] = index
            self._ctl(self._entry(i), rings.ring_address(index))
        self.need_rings = (len(rings.free_rings) < RESERVE
                           and rings.capacity < self.L.MT_SLOTS)

    def adopt(self) -> None:
        """Each entry that holds a thread id: that thread's ring (mt_claim)."""
        for i in range(self.L.MT_POOL_ENTRIES):
            value = self._ctl(self._entry(i))
            index = self.placed[i]
            if index is None or not 0 < value < TID_LIMIT:
                continue
            self.placed[i] = None
            self._ctl(self._entry(i), 0)   # only the tracer writes an entry holding an id
            self.rings.adopt(value, index)
            self.claimed.add(value)
            self.claims += 1

    def reap(self, now_all: bool = False) -> None:
        """Claimed rings whose thread ended go back (drained, counters folded),
        REAP_DELAY after the end was seen (at once while rings run short, or
        ``now_all``)."""
        rings = self.rings
        now = time.monotonic()
        short = now_all or len(rings.free_rings) < RESERVE
        for tid in list(self._dead_since):
            if tid not in self.claimed:
                del self._dead_since[tid]
        for tid in list(self.claimed):
            index = rings.thread_ring.get(tid)
            if index is None:                  # given back at its exit event (traced since)
                self.claimed.discard(tid)
                continue
            key = rings.ring_u64(index, self.L.MT_RING_KEY)
            if key == 0:
                continue                       # its claim is not done yet
            if self._owner_word(~key & ((1 << 64) - 1)) == tid:
                continue
            if now - self._dead_since.setdefault(tid, now) < REAP_DELAY and not short:
                continue
            if not rings.lib.mt_word_cas(rings.ring_local(index) + self.L.MT_RING_TID, tid, 0):
                continue                       # taken over meanwhile: see drain
            rings.unregister(tid)
            self.claimed.discard(tid)
            self.taken_back += 1

    def drain(self, tid: int) -> int:
        """Drains ``tid``'s ring, following its owners: a thread given the TCB of
        the ring's dead thread took the ring over (mt_claim) from the HEAD it
        wrote in MT_RING_OWNERS on; records before it go to the earlier owner's
        file, those after to the new owner's.  HEAD is read first: a later owner
        is recorded before its first record, so every owner up to there is seen."""
        rings, L = self.rings, self.L
        index = rings.thread_ring[tid]
        head = rings.ring_u64(index, L.MT_RING_HEAD)
        written = rings.ring_u64(index, L.MT_RING_OWNERS_W)
        read = rings.ring_u64(index, L.MT_RING_OWNERS_R)
        moved = 0
        while read < written:
            slot = L.MT_RING_OWNERS + 16 * (read % L.MT_RING_OWNER_SLOTS)
            at, owner = rings.ring_u64(index, slot), rings.ring_u64(index, slot + 8)
            moved += rings.drain_records(tid, at)
            tid = self._hand_over(tid, owner, index)
            read += 1
            rings.ring_u64(index, L.MT_RING_OWNERS_R, read)
        return moved + rings.drain_records(tid, head)

    def hand_overs(self) -> int:
        """Drains the rings whose owner changed since the last look (the C drain
        leaves them alone), up to each change; the records moved."""
        rings, L = self.rings, self.L
        moved = 0
        for tid, index in list(rings.thread_ring.items()):
            if rings.thread_ring.get(tid) == index and \
                    rings.ring_u64(index, L.MT_RING_OWNERS_W) != \
                    rings.ring_u64(index, L.MT_RING_OWNERS_R):
                moved += self.drain(tid)
        return moved

    def _hand_over(self, old: int, new: int, index: int) -> int:
        """Ring ``index`` is ``new``'s from here on (``old`` is gone)."""
        rings = self.rings
        rings.collect()    # what the takes moved so far: old's (the C drain skips the ring)
        if rings.thread_ring.get(new, index) != index:
            rings.unregister(new)              # an earlier thread of that id is gone too
        rings.thread_ring.pop(old, None)
        rings.thread_ring[new] = index
        rings.thread_key[new] = rings.thread_key.pop(old, 0)
        rings.records_per_thread.setdefault(new, 0)
        fd = rings.files.pop(old, None)
        if fd is not None:
            os.close(fd)
        rings.spill.set_ring(index, rings.ring_local(index), CALL_RECORDS.path(rings.out_dir, new),
                             rings.recording(new))
        rings.spill.close_file(CALL_RECORDS.path(rings.out_dir, old))
        self.claimed.discard(old)
        self.claimed.add(new)
        self.taken_over += 1
        return new

    def _owner_word(self, thread_pointer: int) -> int | None:
        try:
            data = os.pread(self._mem, 4, thread_pointer + self._ctl(self.L.MT_CTL_OWNER_OFF))
        except OSError:
            return None
        return struct.unpack("<I", data)[0] if len(data) == 4 else None

    # ------------------------------------------------------- seize requests
    def requests(self) -> list[tuple[int, int]]:
        """(entry, thread id) of each thread waiting to be traced."""
        L = self.L
        out = []
        for i in range(L.MT_SEIZE_ENTRIES):
            tid = self._ctl(L.MT_CTL_SEIZE + 8 * i)
            if tid:
                out.append((i, tid))
        return out

    def seized(self, entry: int, tid: int) -> None:
        """The thread of a request is traced now: it goes on (mt_seizeme)."""
        offset = self.L.MT_CTL_SEIZE + 8 * entry
        if self.rings.slots.cas(offset, tid, 0):
            self.seize_requests += 1

    def release_requests(self) -> None:
        """Every waiting thread goes on (detach: nothing of madtrace stays to fork)."""
        for entry, tid in self.requests():
            self.rings.slots.cas(self.L.MT_CTL_SEIZE + 8 * entry,
                                        tid, 0)

    def summary(self) -> dict:
        return {"on": self.active, "claimed": self.claims, "taken_back": self.taken_back,
                "taken_over": self.taken_over,
                "found_empty": self.found_empty, "seized_before_fork_or_exec": self.seize_requests,
                "growth_stops": self.growth_stops}

    def close(self) -> None:
        if self._mem >= 0:
            os.close(self._mem)
            self._mem = -1
