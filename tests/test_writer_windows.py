# SPDX-License-Identifier: GPL-2.0-or-later
"""Signals delivered while a trampoline writes its record (rings/writer_windows.py).

A handler that calls a traced function, run between a trampoline's store of
its record and the record's publication, had its records overwritten: the
calls table then held calls that were never made and missed some that were.
Oracle: the program's own counts of its calls."""

from __future__ import annotations

import json

import pytest

from madtrace.target.templates import load_injector
from madtrace.rings.writer_windows import WriterWindows

from .test_hooks import counts
from .util import madtrace, prog


class Area:
    def __init__(self, address: int, size: int):
        self.address, self.end = address, address + size

    def contains(self, address: int) -> bool:
        return self.address <= address < self.end


def test_every_address_of_a_window_goes_back_to_its_write_mark():
    """A call-site trampoline at an aligned address among others: each address
    from its write mark up to its publish mark (that instruction not run yet)
    maps to the write mark; outside every window, nothing moves."""
    injector = load_injector()
    callsite = injector.templates["callsite_ts"]
    windows = WriterWindows([callsite, injector.templates["entry_ts"]])
    base = 0x7f0000001000
    code = bytearray(b"\xcc" * 0x40)
    at = base + len(code)
    instance = callsite.instantiate(at, **{
        name: at + 0x2000 if points[0][1] == "rel32" else 0x1000
        for name, points in callsite.patch_points.items()})
    code += instance + b"\xcc" * 0x40
    area = Area(base, len(code))
    read = lambda address, size: bytes(code[address - base:address - base + size])  # noqa: E731
    marks = callsite.marks
    for tag in ("_entry", "_exit"):
        write, publish = marks["write" + tag], marks["publish" + tag]
        for offset in range(write, publish + 1):
            assert windows.window_start(at + offset, area, read) == at + write, (tag, offset)
        assert windows.window_start(at + publish + 1, area, read) in (None, at + publish + 1)
    outside = [o for o in range(callsite.size)
               if not any(marks["write" + t] <= o <= marks["publish" + t] for t in ("_entry", "_exit"))]
    assert outside and all(windows.window_start(at + o, area, read) is None for o in outside)
    assert windows.window_start(base + 8, area, read) is None


@pytest.mark.parametrize("method,variant", [("callsite", "O2-pie"), ("entry", "O0-pie")])
def test_a_handlers_calls_are_never_overwritten(tmp_path, method, variant):
    """5 000 signals, each sent while the main thread calls leaf() in a loop;
    the handler calls handled().  The calls table (built from the records)
    counts exactly the calls the program counted, every run.  Where the signals
    land depends on the scheduler: runs are made (up to 3) until some did land
    in a record's writing, the case this is about."""
    for attempt in range(3):
        out = tmp_path / f"t{attempt}"
        result = madtrace("record", "-q", "--method", method, "-f", "leaf", "-f", "handled",
                          "-o", str(out), "--", prog("signal_calls", variant), "5000",
                          timeout=300)
        assert result.returncode == 0, result.stderr
        made = counts(result.stdout)
        made = {"leaf": made["leaf"], "handled": made["handled"]}
        assert made["handled"] == 5000
        meta = json.loads((out / "meta.json").read_text())
        assert {name: meta["calls"].get(name, 0) for name in made} == made
        assert meta["dropped_events"] == 0
        table = madtrace("query", str(out),
                         "SELECT function, count(*) AS n FROM calls GROUP BY 1", "--json")
        assert table.returncode == 0, table.stderr
        rows = {row["function"]: row["n"] for row in json.loads(table.stdout)}
        assert {name: rows.get(name, 0) for name in made} == made
        if meta["function_tracing"]["signals_in_record_writes"] > 0:
            return
    pytest.fail("in 3 runs no signal landed while a record was being written")
