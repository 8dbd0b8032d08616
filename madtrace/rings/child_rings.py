# SPDX-License-Identifier: GPL-2.0-or-later
"""What MadtraceAreas (target/mappings.py) needs of the rings: the calls of entry-patched functions
that have not returned (``shadow_entries``: their real return addresses,
given back at detach), and a fork child's own rings (``private_rings``:
after MadtraceAreas took madtrace's areas out of a fork child whose thread
may still return through a trampoline, the child keeps the code, and its
rings become private copies with recording off, so that it never writes
into the parent's; calls/engine.py ``child_released``)."""

from __future__ import annotations

import numpy as np

from ..process.remote_syscall import (MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, PROT_READ, PROT_WRITE,
                                      RemoteSyscalls)


def private_rings(rings, injector, child) -> None:
    """``rings`` (a RingSet) replaced in ``child`` (a Tracee, stopped) by private
    memory holding their control block and ring headers, recording off."""
    L = injector
    areas = [rings.area] + rings.chunks
    with RemoteSyscalls(child) as rs:
        for area in areas:
            rs.mmap(area.address, area.size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED)
    # control block and slot table, recording off; then each ring's header and shadow stack
    control = bytearray(rings.area.local[:L.MT_CONTROL_AREA])
    control[L.MT_CTL_FLAGS] &= ~L.MT_FLAG_ENABLED & 0xFF
    child.mem.write(rings.area.address, bytes(control))
    for index in rings.thread_ring.values():
        mem, off = rings.ring_memory(index)
        header = bytearray(mem[off: off + L.MT_RING_RECORDS_OFF])
        header[L.MT_RING_LIMIT: L.MT_RING_LIMIT + 8] = bytes(8)   # no room: nothing recorded
        child.mem.write(rings.ring_address(index), bytes(header))


def shadow_entries(rings, fs_bases: dict[int, int] | None = None) -> list[tuple[int, int]]:
    """(real return address, stack slot) of every call of an entry-patched
    function that has not returned, per thread of ``rings`` (a RingSet) from
    the newest; an entry whose slot is not above the newer one's was left by
    longjmp (as the exit stub decides); of two entries for one slot, the older
    (the frame entered twice: the newer saved the exit stub).  ``fs_bases`` ({tid: fs base} of the
    threads stopped now): each thread's ring is also found as the trampolines
    find it (its slot), so a thread that took a ring the tracer has not met
    (claimed from the pool just now, or a dead thread's ring its reused TCB
    found) has its pending calls read too."""
    L = rings.L
    out = []
    seen: set[int] = set()
    with rings.lock:
        if rings.pool is not None and not rings.closed:
            # threads that took a ring from the pool since the last drain: their
            # pending calls too (a thread per request claims one on its first call)
            rings.pool.adopt()
        indexes = list(rings.thread_ring.values())
        if fs_bases:
            by_address = {rings.ring_address(i): i for i in range(rings.capacity)}
            for fs_base in fs_bases.values():
                block = rings.slots.find(~fs_base & ((1 << 64) - 1)) if fs_base else None
                if block in by_address and by_address[block] not in indexes:
                    indexes.append(by_address[block])
        for index in indexes:
            if index in seen:
                continue
            seen.add(index)
            top = min(rings.ring_u64(index, L.MT_RING_SHADOW_TOP), L.MT_SHADOW_ENTRIES)
            mem, offset = rings.ring_memory(index)
            entries = np.frombuffer(mem, dtype="<u8", count=2 * top,
                                    offset=offset + L.MT_RING_SHADOW).reshape(-1, 2).copy()
            newer, kept = 0, 0
            for ret, slot in entries[::-1].tolist():
                if slot > newer:
                    out.append((ret, slot))
                    newer, kept = slot, len(out)
                elif slot == newer and kept:
                    # one frame entered twice (the hybrid engine moved a thread from a
                    # trampoline's relocated prologue into a copy whose entry is traced
                    # too): the newer entry saved the exit stub, the older one holds the
                    # real return address, as the exit stub finds it when it pops both
                    out[kept - 1] = (ret, slot)
    return out
