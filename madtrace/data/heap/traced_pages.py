# SPDX-License-Identifier: GPL-2.0-or-later
"""The traced-page bitmap of the hybrid engine's memcpy & co. hook stubs.

One bit per page of the 47-bit user address space (a sparse 4 GiB memfd,
read by the stubs, written by the tracer): set while the data engine
protects the page (``DataEngine.is_protected``).  A memcpy/memmove/memset stub
(inline_hooks.py) checks every page of a buffer against it and against the
alias bitmap (alias.py): a buffer on traced pages, all aliased, is reached
through the alias and makes a block event; on traced pages not all aliased,
the tracer takes the call; on no traced page, the call goes on untouched.
``update(runs)`` follows the engine's protected runs (DataEngine.tables_changed),
setting what is new before clearing what went, so that a running stub never
sees a traced page as untraced while it stays protected.
"""

from __future__ import annotations

import numpy as np

from ...target.areas import SharedArea
from ...process.remote_syscall import RemoteSyscalls
from ..hybrid.alias import set_page_bits

BITMAP_BYTES = 1 << 32           # one bit per page of the 47-bit user address space


class TracedPages:
    def __init__(self, rs: RemoteSyscalls, group: str):
        """``group``: the areas it stays or goes with (the stubs that read it)."""
        self.bitmap = SharedArea(rs, BITMAP_BYTES, "madtrace-traced", executable=False,
                                 group=group)
        self.bits = np.frombuffer(self.bitmap.local, dtype=np.uint8)
        self._traced = _Spans()

    @property
    def address(self) -> int:
        return self.bitmap.address

    def update(self, runs) -> None:
        """``runs``: (start, end) of every page run the engine protects now."""
        new = _Spans(runs)
        for start, end in new.minus(self._traced):
            self._set(start, end, True)
        for start, end in self._traced.minus(new):
            self._set(start, end, False)
        self._traced = new

    def _set(self, start: int, end: int, on: bool) -> None:
        set_page_bits(self.bits, start, end, on)

class _Spans:
    """Sorted, disjoint [start, end) page runs."""

    def __init__(self, runs=()):
        self.runs = sorted((int(s), int(e)) for s, e in runs if e > s)

    def minus(self, other: "_Spans") -> list[tuple[int, int]]:
        out = []
        for start, end in self.runs:
            cursor = start
            for s, e in other.runs:
                if e <= cursor or s >= end:
                    continue
                if s > cursor:
                    out.append((cursor, s))
                cursor = max(cursor, e)
            if cursor < end:
                out.append((cursor, end))
        return out
