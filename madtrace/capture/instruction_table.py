# SPDX-License-Identifier: GPL-2.0-or-later
"""What a data record's instruction id stands for (hybrid data engine).

A data record in a ring holds only what the instruction does not imply: the
address it accessed and an instruction id.  The id stands for the original
instruction's address and length, the operand's size, what it does to it
(``kind``: 1 load, 2 store, 3 load then store, as lackey's "M") and whether
it is the first access of one execution (``first``: 0 for the store half of
a string move, whose load was recorded just before).  Ids are given once,
when a probe is built or an instruction joins the fault loop; 0 is never one.
"""

from __future__ import annotations

import numpy as np

from ..inject.templates import load_injector
from ..trace.format import KIND_LOAD, KIND_STORE

KIND_BOTH = KIND_LOAD | KIND_STORE
PROBE, FAULT = 0, 1          # the path whose records carry the id


class InstructionTable:
    def __init__(self):
        self._rows: list[tuple[int, int, int, int, int, int]] = [(0, 0, 0, 0, 0, 0)]
        self._arrays = None
        self._by_key: dict[tuple, int] = {}
        L = load_injector()
        self._limit = L.MT_HOOK_CODE - L.MT_DATA_CODE

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, rip: int, size: int, kind: int, ilen: int, first: int = 1,
            path: int = PROBE) -> int:
        """The id of (instruction, operand size, kind, first, path), given once."""
        key = (rip, size, kind, ilen, first, path)
        ident = self._by_key.get(key)
        if ident is None:
            ident = self._by_key[key] = len(self._rows)
            if ident >= self._limit:      # the codes above are the hook stubs' (layout.h)
                raise OverflowError(f"more than {self._limit} instruction ids")
            self._rows.append(key)
            self._arrays = None
        return ident

    def arrays(self) -> dict[str, np.ndarray]:
        """Columns indexed by id: rip, size, kind, ilen, first, path."""
        if self._arrays is None:
            rows = np.array(self._rows, dtype=np.uint64)
            self._arrays = {"rip": rows[:, 0], "size": rows[:, 1].astype(np.uint16),
                            "kind": rows[:, 2].astype(np.uint8), "ilen": rows[:, 3].astype(np.uint8),
                            "first": rows[:, 4].astype(np.uint8), "path": rows[:, 5].astype(np.uint8)}
        return self._arrays

    def rows_from(self, start: int) -> list[tuple[int, int, int, int, int, int]]:
        """The rows of ids ``start`` and after (another thread may be adding)."""
        return self._rows[start:]
