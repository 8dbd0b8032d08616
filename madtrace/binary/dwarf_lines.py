# SPDX-License-Identifier: GPL-2.0-or-later
"""DWARF line tables: ELF address -> (source file, line).

``LineTable`` (an image's: dwarf_cache.line_table, empty when the file has no
debug info).  ``LineTable.lookup(addresses)`` maps an array
of ELF-relative addresses to (file index, line) arrays (file index -1: no
line), ``files`` lists the source paths (absolute when the compilation
directory is known).  Rows are the line programs' rows of every compilation
unit (mtdwarf through the symbol cache; ``_read`` is the pyelftools reader the
tests compare it with), sorted by address; an address belongs to the last row
at or below it, unless that row ends a sequence.
"""

from __future__ import annotations

import os

import numpy as np


class LineTable:
    def __init__(self, addresses: np.ndarray, file_index: np.ndarray, lines: np.ndarray,
                 files: list[str]):
        if len(addresses) > 1 and not bool(np.all(addresses[1:] >= addresses[:-1])):
            order = np.argsort(addresses, kind="stable")
            addresses, file_index, lines = addresses[order], file_index[order], lines[order]
        self.addresses, self.file_index, self.lines = addresses, file_index, lines
        self.files = files

    def __len__(self) -> int:
        return len(self.addresses)

    @classmethod
    def empty(cls) -> "LineTable":
        return cls(np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64),
                   np.zeros(0, dtype=np.int64), [])

    def lookup(self, addresses) -> tuple[np.ndarray, np.ndarray]:
        addresses = np.asarray(addresses, dtype=np.uint64)
        if not len(self.addresses):
            return (np.full(len(addresses), -1, dtype=np.int64),
                    np.zeros(len(addresses), dtype=np.int64))
        i = np.searchsorted(self.addresses, addresses, side="right").astype(np.int64) - 1
        j = np.maximum(i, 0)
        files = np.where(i >= 0, self.file_index[j], -1)
        return files, np.where(files >= 0, self.lines[j], 0)


def _file_names(program, comp_dir: str) -> list[str]:
    header = program.header
    version = header["version"]
    dirs = [d.decode(errors="replace") if isinstance(d, bytes) else d
            for d in header["include_directory"]]
    names = []
    for entry in header["file_entry"]:
        name = entry.name.decode(errors="replace") if isinstance(entry.name, bytes) else entry.name
        d = entry.dir_index
        if version >= 5:
            directory = dirs[d] if d < len(dirs) else ""
        else:
            directory = dirs[d - 1] if 0 < d <= len(dirs) else comp_dir
        path = os.path.join(directory, name) if directory else name
        if not os.path.isabs(path) and comp_dir:
            path = os.path.join(comp_dir, path)
        names.append(os.path.normpath(path))
    return names


def _read(stream) -> LineTable:
    from elftools.common.exceptions import DWARFError, ELFError
    from elftools.elf.elffile import ELFFile

    addresses: list[int] = []
    file_index: list[int] = []
    lines: list[int] = []
    files: list[str] = []
    known: dict[str, int] = {}
    try:
        elf = ELFFile(stream)
        if not elf.has_dwarf_info():
            raise ValueError("no DWARF")
        dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False)
        for cu in dwarf.iter_CUs():
            program = dwarf.line_program_for_CU(cu)
            if program is None:
                continue
            top = cu.get_top_DIE()
            comp_dir = top.attributes.get("DW_AT_comp_dir")
            comp_dir = comp_dir.value.decode(errors="replace") if comp_dir is not None and \
                isinstance(comp_dir.value, bytes) else ""
            names = _file_names(program, comp_dir)
            base = 0 if program.header["version"] >= 5 else 1
            for entry in program.get_entries():
                state = entry.state
                if state is None:
                    continue
                addresses.append(state.address)
                if state.end_sequence:
                    file_index.append(-1)
                    lines.append(0)
                    continue
                k = state.file - base
                name = names[k] if 0 <= k < len(names) else f"<file {state.file}>"
                if name not in known:
                    known[name] = len(files)
                    files.append(name)
                file_index.append(known[name])
                lines.append(state.line)
    except (ELFError, DWARFError, ValueError, KeyError, IndexError, AttributeError, TypeError,
            AssertionError):
        pass   # keep what was read; no or unsupported debug info means no lines
    return LineTable(np.array(addresses, dtype=np.uint64), np.array(file_index, dtype=np.int64),
                     np.array(lines, dtype=np.int64), files)
