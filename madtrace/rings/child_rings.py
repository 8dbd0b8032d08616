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


def shadow_entries(rings) -> list[tuple[int, int]]:
    """(real return address, stack slot) of every call of an entry-patched
    function that has not returned, per thread of ``rings`` (a RingSet) from
    the newest; an entry whose slot is not above the newer one's was left by
    longjmp (as the exit stub decides)."""
    L = rings.L
    out = []
    with rings.lock:
        for index in rings.thread_ring.values():
            top = min(rings.ring_u64(index, L.MT_RING_SHADOW_TOP), L.MT_SHADOW_ENTRIES)
            mem, offset = rings.ring_memory(index)
            entries = np.frombuffer(mem, dtype="<u8", count=2 * top,
                                    offset=offset + L.MT_RING_SHADOW).reshape(-1, 2).copy()
            newer = 0
            for ret, slot in entries[::-1].tolist():
                if slot > newer:
                    out.append((ret, slot))
                    newer = slot
    return out
