# SPDX-License-Identifier: GPL-2.0-or-later
"""Naming of PLT stubs (``malloc@plt``) by disassembly.

``find_plt_entries(sections, read, got_names) -> dict[str, tuple[int, int]]``
disassembles ``.plt``, ``.plt.sec`` and ``.plt.got`` with capstone.  A stub is
the run of instructions that starts at the first non-padding instruction after
the previous unconditional ``jmp`` and contains a ``jmp qword ptr [rip+X]``
(possibly ``bnd jmp`` / ``notrack jmp``).  ``X`` resolved against the next
instruction address gives the GOT slot; ``got_names`` maps GOT slot addresses
to symbol names (from JUMP_SLOT and GLOB_DAT relocations).  The result lists
``("name@plt", stub address, stub size)``; addresses are relative to the
ELF (link-time virtual addresses).  This handles the classic layout (stubs in
``.plt``, lazy binding), the IBT layout (``endbr64`` + ``bnd jmp`` stubs in
``.plt.sec``, the ``.plt`` stubs only push + jmp to PLT0 and are ignored) and
``.plt.got`` (GLOB_DAT slots, e.g. ``__cxa_finalize``), for PIE, non-PIE and
shared objects.  Absolute ``jmp qword ptr [0x601018]`` forms are accepted too.
"""

from __future__ import annotations

import re

PLT_SECTIONS = (".plt", ".plt.sec", ".plt.got")

_MEM_RIP = re.compile(r"^qword ptr \[rip (?P<sign>[+-]) (?P<disp>0x[0-9a-f]+|\d+)\]$")
_MEM_ABS = re.compile(r"^qword ptr \[(?P<abs>0x[0-9a-f]+|\d+)\]$")
_JMP_MNEMONICS = {"jmp", "bnd jmp", "notrack jmp", "notrack bnd jmp", "bnd notrack jmp"}

_cs = None


def _capstone():
    global _cs
    if _cs is None:
        import capstone

        _cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        _cs.detail = False
        _cs.skipdata = True
    return _cs


def _slot_of(address: int, size: int, mnemonic: str, op_str: str) -> int | None:
    if mnemonic not in _JMP_MNEMONICS:
        return None
    m = _MEM_RIP.match(op_str)
    if m:
        disp = int(m.group("disp"), 0)
        if m.group("sign") == "-":
            disp = -disp
        return address + size + disp
    m = _MEM_ABS.match(op_str)
    if m:
        return int(m.group("abs"), 0)
    return None


def _is_padding(mnemonic: str) -> bool:
    return mnemonic.startswith("nop") or mnemonic in ("xchg", "int3", ".byte")


def find_plt_entries(sections, read, got_names: dict[int, str]) -> list[tuple[str, int, int]]:
    """Return ``[("name@plt", address, size)]`` for every PLT stub found
    (names can repeat: two IRELATIVE slots of the same IFUNC).

    *sections* is an iterable of objects with ``name``, ``address``, ``size``,
    ``offset`` and ``type``; *read(offset, size)* returns file bytes.
    """
    result: list[tuple[str, int, int]] = []
    if not got_names:
        return result
    cs = None
    for sec in sections:
        if sec.name not in PLT_SECTIONS or sec.size == 0 or sec.type == 8:  # SHT_NOBITS
            continue
        if cs is None:
            cs = _capstone()
        code = read(sec.offset, sec.size)
        sec_end = sec.address + sec.size
        stub_start = None
        found: list[tuple[int, str]] = []
        for address, size, mnemonic, op_str in cs.disasm_lite(code, sec.address):
            if stub_start is None:
                if _is_padding(mnemonic):
                    continue
                stub_start = address
            if mnemonic.endswith("jmp"):
                slot = _slot_of(address, size, mnemonic, op_str)
                if slot is not None and slot in got_names:
                    found.append((stub_start, got_names[slot]))
                stub_start = None
        # size of a stub = distance to the next stub (or to the section end)
        for i, (start, name) in enumerate(found):
            end = found[i + 1][0] if i + 1 < len(found) else sec_end
            result.append((name + "@plt", start, end - start))
    return result
