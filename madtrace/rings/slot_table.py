# SPDX-License-Identifier: GPL-2.0-or-later
"""The slot table of the rings (layout.h): {key = NOT(fs base), ring block}
per thread, probed linearly from the key's hash to the end of the table (as
the trampolines' LOOKUP does), 0 ending a chain and MT_SLOT_TOMBSTONE left
where a thread's entry was.  Threads that claim a ring from the pool
(layout.h "Ring pool", mt_claim) change entries concurrently with
``lock cmpxchg16b``, so the tracer changes them the same way (the C helper
mt_slot_cas of ring_drain.c): an entry is read, then replaced only if it
still holds what was read."""

from __future__ import annotations

import ctypes
import struct
from typing import Iterator


class SlotTable:
    def __init__(self, mem, injector, lib):
        """``mem``: the tracer's mapping of the control area; ``lib``: libmtdrain."""
        self.mem = mem
        self.L = injector
        self.tombstone = injector.MT_SLOT_TOMBSTONE
        self._lib = lib
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(mem))

    def cas(self, offset: int, expected: int, new: int) -> bool:
        """Compare-and-swap of the 8-byte word at ``offset`` of the control area, as
        the target's threads see it (interrupt-atomic: lock cmpxchg)."""
        return bool(self._lib.mt_word_cas(self._base + offset, expected, new))

    def entry(self, offset: int) -> tuple[int, int]:
        """(key, ring block address) of the entry at ``offset`` in the control area."""
        return struct.unpack_from("<QQ", self.mem, offset)

    def chain(self, key: int) -> Iterator[int]:
        """The offsets of the entries probed for ``key``, in order."""
        L = self.L
        first = (key >> L.MT_SLOT_HASH_SHIFT) & (L.MT_SLOTS - 1)
        for i in range(first, L.MT_SLOT_TABLE_SIZE // L.MT_SLOT_ENTRY_SIZE):
            yield L.MT_SLOT_TABLE + i * L.MT_SLOT_ENTRY_SIZE

    def _cas(self, offset: int, old: tuple[int, int], new: tuple[int, int]) -> bool:
        return bool(self._lib.mt_slot_cas(self._base + offset, *old, *new))

    def find(self, key: int) -> int | None:
        """The ring block of ``key`` (None: no entry)."""
        for offset in self.chain(key):
            current = self.entry(offset)
            if current[0] == key:
                return current[1]
            if current[0] == 0:
                return None
        return None

    def insert(self, key: int, ring: int) -> bool:
        """{key, ring} at the first free or tombstone entry of key's chain.  False:
        the key has an entry already, or its chain has no room."""
        while True:
            spot = None
            for offset in self.chain(key):
                current = self.entry(offset)
                if current[0] == key:
                    return False
                if current[0] in (0, self.tombstone):
                    spot = spot or (offset, current)
                    if current[0] == 0:
                        break
            if spot is None:
                return False
            if self._cas(spot[0], spot[1], (key, ring)):
                return True

    def remove(self, key: int, ring: int) -> bool:
        """Tombstones the entry {key, ring} if it is still there (a thread given the
        same key, a dead thread's TCB, may have put its own ring in it since).
        Returns whether it did."""
        while True:
            for offset in self.chain(key):
                current = self.entry(offset)
                if current == (key, ring):
                    if self._cas(offset, current, (self.tombstone, 0)):
                        return True
                    break               # changed meanwhile: look again
                if current[0] == 0:
                    return False
            else:
                return False
