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

import threading

import numpy as np

from ..target.templates import load_injector
from ..trace.format import KIND_LOAD, KIND_STORE

KIND_BOTH = KIND_LOAD | KIND_STORE
PROBE, FAULT = 0, 1          # the path whose records carry the id


# the columns C reads (data_records.py _IdTable), in the order of a row
COLUMNS = (("rip", np.uint64), ("size", np.uint16), ("kind", np.uint8), ("ilen", np.uint8),
           ("first", np.uint8), ("path", np.uint8))


class InstructionTable:
    """Rows kept in a list as they are given, and written into numpy columns of
    doubling capacity when a reader asks for them (``arrays``, vectorised): a new
    id costs a dictionary lookup and an append whatever the number of ids
    (python3 gives ~50 000 while the drain reads the table after each batch)."""

    def __init__(self):
        self._rows: list[tuple[int, int, int, int, int, int]] = [(0, 0, 0, 0, 0, 0)]
        self._columns = {name: np.zeros(1024, dtype=dtype) for name, dtype in COLUMNS}
        self._in_columns = 1          # rows written into the columns
        self._by_key: dict[tuple, int] = {}
        self._lock = threading.Lock()    # the drain thread reads while the tracer adds
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
            with self._lock:
                ident = len(self._rows)
                if ident >= self._limit:      # the codes above are the hook stubs' (layout.h)
                    raise OverflowError(f"more than {self._limit} instruction ids")
                self._by_key[key] = ident
                self._rows.append(key)
        return ident

    def arrays(self) -> dict[str, np.ndarray]:
        """Columns indexed by id: rip, size, kind, ilen, first, path (views: rows
        added later do not show, the values shown never change)."""
        with self._lock:
            n = len(self._rows)
            done = self._in_columns
            if done < n:
                columns = self._columns
                if n > len(columns["rip"]):     # a reader keeps the old columns it holds
                    size = len(columns["rip"])
                    while size < n:
                        size *= 2
                    grown = {name: np.zeros(size, dtype=c.dtype) for name, c in columns.items()}
                    for name, c in columns.items():
                        grown[name][:done] = c[:done]
                    columns = self._columns = grown
                for (name, _), values in zip(COLUMNS, zip(*self._rows[done:n])):
                    columns[name][done:n] = values
                self._in_columns = n
            return {name: column[:n] for name, column in self._columns.items()}

    def rows_from(self, start: int) -> list[tuple[int, int, int, int, int, int]]:
        """The rows of ids ``start`` and after (another thread may be adding)."""
        return self._rows[start:]
