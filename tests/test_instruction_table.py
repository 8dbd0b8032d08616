# SPDX-License-Identifier: GPL-2.0-or-later
"""The hybrid engine's instruction table (data/instruction_table.py): ids
given once per (instruction, size, kind, first, path), and the columns the
drain reads while the tracer adds (oracle: the rows as given)."""

from __future__ import annotations

import threading

import numpy as np

from madtrace.data.instruction_table import COLUMNS, FAULT, InstructionTable


def test_ids_are_given_once_and_the_columns_hold_them():
    table = InstructionTable()
    a = table.add(0x401000, 8, 1, 4)
    assert table.add(0x401000, 8, 1, 4) == a == 1
    b = table.add(0x401000, 8, 1, 4, path=FAULT)
    assert b == 2 and len(table) == 3
    cols = table.arrays()
    assert cols["rip"].tolist() == [0, 0x401000, 0x401000]
    assert cols["path"].tolist() == [0, 0, FAULT]
    assert [c.dtype for c in cols.values()] == [np.dtype(d) for _, d in COLUMNS]


def test_a_reader_sees_every_row_it_counts_while_rows_are_added():
    """The drain thread reads the columns (growing past their capacity many times)
    while the tracer adds 20 000 ids; every view it got stays what it was."""
    table = InstructionTable()
    rows = [(0x400000 + 7 * i, 1 << (i % 4), 1 + i % 3, 1 + i % 15, i % 2, i % 2)
            for i in range(20_000)]
    seen: list[dict] = []
    done = threading.Event()

    def reader():
        while not done.is_set():
            seen.append(table.arrays())
        seen.append(table.arrays())

    thread = threading.Thread(target=reader)
    thread.start()
    for row in rows:
        table.add(*row)
    done.set()
    thread.join()
    assert len(seen) > 1
    expected = {name: np.array([0] + [r[k] for r in rows], dtype=dtype)
                for k, (name, dtype) in enumerate(COLUMNS)}
    for view in seen:
        n = len(view["rip"])
        for name, column in view.items():
            assert np.array_equal(column, expected[name][:n]), name
    assert len(seen[-1]["rip"]) == len(rows) + 1
