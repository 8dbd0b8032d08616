# SPDX-License-Identifier: GPL-2.0-or-later
"""A fork child's own rings: after the footprint took madtrace's areas out of
a fork child whose thread may still return through a trampoline, the child
keeps the code, and its rings become private copies with recording off, so
that it never writes into the parent's (inject/engine.py ``child_released``)."""

from __future__ import annotations

from ..process.remote_syscall import (MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, PROT_READ,
                                      PROT_WRITE, RemoteSyscalls)


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
        mem, off = rings._where(index)
        header = bytearray(mem[off: off + L.MT_RING_RECORDS_OFF])
        header[L.MT_RING_LIMIT: L.MT_RING_LIMIT + 8] = bytes(8)   # no room: nothing recorded
        child.mem.write(rings.ring_address(index), bytes(header))
