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


# the columns C reads (data_records.py _IdTable), in the order of a row
COLUMNS = (("rip", np.uint64), ("size", np.uint16), ("kind", np.uint8), ("ilen", np.uint8),
           ("first", np.uint8), ("path", np.uint8))


class InstructionTable:
    """Rows appended to columns of doubling capacity: a new id costs the same
    whatever the number of ids (python3 gives ~50 000 while the drain reads the
    table after each batch of new ones)."""

    def __init__(self):
        self._rows: list[tuple[int, int, int, int, int, int]] = [(0, 0, 0, 0, 0, 0)]
        self._columns = {name: np.zeros(1024, dtype=dtype) for name, dtype in COLUMNS}
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
            ident = len(self._rows)
            if ident >= self._limit:      # the codes above are the hook stubs' (layout.h)
                raise OverflowError(f"more than {self._limit} instruction ids")
            columns = self._columns
            if ident >= len(columns["rip"]):   # a reader keeps the old columns it holds
                columns = {name: np.concatenate([c, np.zeros_like(c)]) for name, c in columns.items()}
                self._columns = columns
            for (name, _), value in zip(COLUMNS, key):
                columns[name][ident] = value
            self._by_key[key] = ident
            self._rows.append(key)     # last: a reader that counts the row finds its columns
        return ident

    def arrays(self) -> dict[str, np.ndarray]:
        """Columns indexed by id: rip, size, kind, ilen, first, path (views: rows
        added later do not show, the values shown never change)."""
        n = len(self._rows)
        return {name: column[:n] for name, column in self._columns.items()}

    def rows_from(self, start: int) -> list[tuple[int, int, int, int, int, int]]:
        """The rows of ids ``start`` and after (another thread may be adding)."""
        return self._rows[start:]
