# SPDX-License-Identifier: GPL-2.0-or-later
"""Data accesses per source line (madtrace report DIR --kind source, and the
annotated sources of the HTML report).

Each access's instruction address is placed in its module (the memory map
saved in the trace directory) and looked up in that module's DWARF line
table (binary/dwarf_lines.py): loads, stores and bytes accumulate per
(source file, line).  Block events (memcpy, memset, read()...) count on the
line of their call site, as block events and bytes moved.  Instructions
without a line (libraries without debug info) are totalled per function
(``symbol`` of the instruction).  One pass over the accesses; memory: one
entry per distinct instruction.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..binary.dwarf_cache import line_table
from ..trace.access_pass import Tally
from ..trace.block_event_records import block_events
from ..trace.naming import address_space_of
from .shared_pass import Part, run_parts
from .trace_input import require_accesses

# columns of a line: loads, stores, bytes (of loads and stores), block events, block bytes
COLUMNS = ("loads", "stores", "bytes", "block_events", "block_bytes")


@dataclass
class SourceReport:
    directory: str
    files: dict[str, dict[int, list[int]]]          # path -> line -> COLUMNS
    without_lines: dict[str, list[int]] = field(default_factory=dict)   # function -> COLUMNS

    def file_totals(self, path: str) -> list[int]:
        return [sum(row[k] for row in self.files[path].values()) for k in range(len(COLUMNS))]

    def ordered_files(self) -> list[str]:
        return sorted(self.files, key=lambda p: (-sum(self.file_totals(p)[:2]), p))

    def to_dict(self) -> dict:
        return {"kind": "source", "directory": self.directory, "columns": list(COLUMNS),
                "files": [{"path": path, "exists": os.path.exists(path),
                           **dict(zip(COLUMNS, self.file_totals(path))),
                           "lines": [{"line": line, **dict(zip(COLUMNS, row))}
                                     for line, row in sorted(self.files[path].items())]}
                          for path in self.ordered_files()],
                "without_lines": [{"function": name, **dict(zip(COLUMNS, row))}
                                  for name, row in sorted(self.without_lines.items(),
                                                          key=lambda kv: (-kv[1][0] - kv[1][1], kv[0]))]}


class SourcePart(Part):
    """The accesses per source line as a part of the shared pass:
    access_counters.c tallies them per instruction (rip << 1 | store ->
    accesses, bytes); the lines and the block events after the accesses."""

    label = "source"

    def __init__(self, directory: str):
        require_accesses(directory, "source")
        self.directory = directory
        self.by_instruction = Tally(2)
        self.counter = ("source", self.by_instruction)

    def per_instruction(self) -> dict[int, list[int]]:
        """{instruction address: [loads, stores, bytes, 0, 0]}."""
        keys, sums, _ = self.by_instruction.result()
        order = np.argsort(keys, kind="stable")        # by address: ties keep that order
        out: dict[int, list[int]] = {}
        for key, (n, nbytes) in zip(keys[order].tolist(), sums[order].tolist()):
            row = out.setdefault(key >> 1, [0, 0, 0, 0, 0])
            row[key & 1] += n
            row[2] += nbytes
        return out

    def result(self) -> SourceReport:
        directory = self.directory
        rows = self.per_instruction()
        for event in block_events(directory):
            row = rows.setdefault(int(event.get("rip") or 0), [0, 0, 0, 0, 0])
            row[3] += 1
            row[4] += int(event["size"])
        report = SourceReport(directory, {})
        for rip, (path, line) in place_instructions(directory, list(rows)).items():
            if path is not None:
                target = report.files.setdefault(path, {}).setdefault(int(line), [0] * 5)
            else:
                target = report.without_lines.setdefault(str(line), [0] * 5)
            for k in range(5):
                target[k] += rows[rip][k]
        return report

    def close(self) -> None:
        self.by_instruction.close()


def source_lines(directory: str) -> SourceReport:
    return run_parts(directory, [SourcePart(directory)])[0]


def place_instructions(directory: str, rips: list[int]) -> dict[int, tuple[str | None, int | str]]:
    """Each instruction's source (path, line) from its module's DWARF line
    table, or (None, function) when it has no line (a library without debug
    information: the function ``symbol`` of the instruction)."""
    space = address_space_of(directory)
    by_module: dict[object, list[int]] = {}
    for rip in rips:
        by_module.setdefault(space.module_for(rip), []).append(rip)
    out: dict[int, tuple[str | None, int | str]] = {}
    for module, group in by_module.items():
        if module is not None and module.name != "[vdso]":
            files, lines = line_table(module.image).lookup(
                np.array(group, dtype=np.uint64) - np.uint64(module.bias))
            names = line_table(module.image).files
        else:
            files, lines, names = np.full(len(group), -1), np.zeros(len(group)), []
        for rip, f, line in zip(group, files.tolist(), lines.tolist()):
            if f >= 0 and line > 0:
                out[rip] = (names[f], int(line))
            else:
                out[rip] = (None, space.code_location(rip).rsplit("+", 1)[0])
    return out
