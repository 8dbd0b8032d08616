# SPDX-License-Identifier: GPL-2.0-or-later
"""The pending calls of entry-patched functions given back at detach
(madtrace/rings/child_rings.py shadow_entries), on ring memory laid out as the
trampolines write it (injector/trampolines.S ENTRY and EXITSTUB).

Oracle: the exit stub's own rule, applied by hand: it pops the shadow stack
down to its frame, so of two entries for one stack slot (one call entered
twice) the newer returns into the exit stub and the older holds the real
return address; an entry below a newer one's slot was left by longjmp.  And
the rings a live thread writes to as the trampolines find it: its slot in the
table (a ring the tracer has not adopted), not only the rings it knows.
"""

from __future__ import annotations

import struct
import threading
from types import SimpleNamespace

from madtrace.rings.child_rings import shadow_entries

SHADOW, TOP, ENTRIES = 64, 8, 32
RING = SHADOW + 16 * ENTRIES
EXIT_STUB = 0x307BB0


class FakeRings:
    """The part of a RingSet shadow_entries reads: rings laid out back to back."""

    def __init__(self, rings: int, known: dict[int, int], slots: dict[int, int]):
        self.L = SimpleNamespace(MT_RING_SHADOW=SHADOW, MT_RING_SHADOW_TOP=TOP,
                                 MT_SHADOW_ENTRIES=ENTRIES)
        self.mem = bytearray(RING * rings)
        self.capacity = rings
        self.thread_ring = dict(known)
        self.lock = threading.RLock()
        self.pool = None
        self.closed = False
        self.slots = SimpleNamespace(find=lambda key: slots.get(key))

    def ring_memory(self, index):
        return self.mem, index * RING

    def ring_u64(self, index, field):
        return struct.unpack_from("<Q", self.mem, index * RING + field)[0]

    def ring_address(self, index):
        return 0x7F0000000000 + index * RING

    def push(self, index, ret, slot):
        top = self.ring_u64(index, TOP)
        struct.pack_into("<QQ", self.mem, index * RING + SHADOW + 16 * top, ret, slot)
        struct.pack_into("<Q", self.mem, index * RING + TOP, top + 1)


def test_a_frame_entered_twice_gives_back_its_real_return():
    rings = FakeRings(1, {100: 0}, {})
    rings.push(0, 0x401000, 0x7FFE0000)       # main's call, the oldest frame
    rings.push(0, 0x40AE8844, 0x7FFDFA18)     # a call from a copied function
    rings.push(0, EXIT_STUB, 0x7FFDFA18)      # the same frame entered again
    rings.push(0, 0x402000, 0x7FFDF900)       # a deeper call
    assert sorted(shadow_entries(rings)) == sorted(
        [(0x402000, 0x7FFDF900), (0x40AE8844, 0x7FFDFA18), (0x401000, 0x7FFE0000)])


def test_frames_left_by_longjmp_are_skipped():
    rings = FakeRings(1, {100: 0}, {})
    rings.push(0, 0x401000, 0x7FFE0000)
    rings.push(0, 0x403000, 0x7FFD0000)       # deeper, then longjmp out of it
    rings.push(0, 0x404000, 0x7FFDF000)       # a newer call above it: the older one is stale
    assert sorted(shadow_entries(rings)) == sorted([(0x404000, 0x7FFDF000), (0x401000, 0x7FFE0000)])


def test_a_ring_found_by_a_threads_slot_is_read():
    """Thread 200 writes to ring 1, which the tracer does not know (a dead
    thread's ring its reused TCB found, or one claimed since the last drain)."""
    fs_base = 0x7F1234567000
    rings = FakeRings(2, {100: 0}, {~fs_base & ((1 << 64) - 1): 0x7F0000000000 + RING})
    rings.push(0, 0x401000, 0x7FFE0000)
    rings.push(1, 0x405000, 0x7F12345FE000)
    assert shadow_entries(rings) == [(0x401000, 0x7FFE0000)]
    assert sorted(shadow_entries(rings, {100: 0x7F0000001000, 200: fs_base})) == sorted(
        [(0x401000, 0x7FFE0000), (0x405000, 0x7F12345FE000)])
