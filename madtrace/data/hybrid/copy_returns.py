# SPDX-License-Identifier: GPL-2.0-or-later
"""The return points of a code area of function copies, listed in the area itself.

A call made in a copy returns to the copy, and a system call made there leaves
the copy's address in %rcx (rewriting.py ``return_points``): at detach each
gets the original code's address back.  A session killed before its detach
takes that knowledge with it, so each copies area lists its return points in
its last ``TABLE_BYTES``: entries of {u64 address in the copy, u64 the
original's}, from the end down, under a header of ``MAGIC`` and the number of
entries (written after them); the next session reads it (alias_leftovers.py)
and gives those return addresses back as a detach does, so that an earlier
session's copies go once no thread runs in them.
"""

from __future__ import annotations

import struct

from ...errors import MadtraceError

TABLE_BYTES = 4 << 20
MAGIC = b"MTRETURN"
ENTRY = struct.Struct("<QQ")
HEADER = struct.Struct("<8sQ")


class ReturnTable:
    """The table at the end of ``area`` (a SharedArea), written as copies are made."""

    def __init__(self, area):
        self.area = area
        self.count = 0
        self.capacity = (TABLE_BYTES - HEADER.size) // ENTRY.size
        self.full = False          # later return points are known to this session only

    @property
    def start(self) -> int:
        """Where the table begins: copies go below."""
        return self.area.end - TABLE_BYTES

    def add(self, returns: dict[int, int]) -> None:
        if self.count + len(returns) > self.capacity:
            self.full = True
            return
        header_at = self.area.end - HEADER.size
        for copy_address, original in returns.items():
            self.count += 1
            self.area.write(header_at - self.count * ENTRY.size, ENTRY.pack(copy_address, original))
        self.area.write(header_at, HEADER.pack(MAGIC, self.count))


def read_return_table(mem, start: int, end: int) -> dict[int, int] | None:
    """The return points an area [start, end) lists (None: it lists none)."""
    try:
        magic, count = HEADER.unpack(mem.read(end - HEADER.size, HEADER.size))
        if magic != MAGIC or count > (TABLE_BYTES - HEADER.size) // ENTRY.size:
            return None
        raw = mem.read(end - HEADER.size - count * ENTRY.size, count * ENTRY.size)
    except MadtraceError:
        return None
    return {copy: original for copy, original in ENTRY.iter_unpack(raw)
            if start <= copy < end - TABLE_BYTES}
