# SPDX-License-Identifier: GPL-2.0-or-later
"""Naming of PLT stubs (``malloc@plt``) by disassembly.

``find_plt_entries(sections, read, got_names) -> dict[str, tuple[int, int]]``
decodes ``.plt``, ``.plt.sec`` and ``.plt.got`` (the usual stub encodings
by hand, anything else with capstone).  A stub is
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


class _Unknown(Exception):
    """An instruction the stub decoder does not know: capstone decodes the section."""


def _modrm_length(code: bytes, i: int) -> int:
    """Bytes of a ModRM operand starting at ``code[i]`` (ModRM, SIB, displacement)."""
    modrm = code[i]
    mod, rm = modrm >> 6, modrm & 7
    n = 1
    if mod != 3 and rm == 4:                  # SIB
        n += 1
        if mod == 0 and code[i + 1] & 7 == 5:
            n += 4
    if mod == 0 and rm == 5:
        n += 4
    elif mod == 1:
        n += 1
    elif mod == 2:
        n += 4
    return n


def _stub_instructions(code: bytes, base: int):
    """(address, size, padding, jump, GOT slot or None) of each instruction of a
    PLT section, for the few encodings linkers put there (endbr64; push; jmp
    qword ptr [rip+X] / [X] with bnd or notrack prefixes; jmp rel; nop forms;
    int3).  _Unknown for anything else.  Same classification as capstone's
    (tests/test_binary.py compares them on every ELF file of the machine)."""
    i, end = 0, len(code)
    try:
        while i < end:
            start = i
            prefixes = b""
            while code[i] in (0xF2, 0x3E, 0x66, 0x2E) and len(prefixes) < 8:
                prefixes += code[i:i + 1]
                i += 1
            op = code[i]
            jump_prefixes = set(prefixes) <= {0xF2, 0x3E}
            padding = jump = False
            slot = None
            if code[start:start + 4] == b"\xf3\x0f\x1e\xfa" and i == start:
                i += 4                                         # endbr64
            elif op == 0xFF and code[i + 1] == 0x25 and jump_prefixes:
                disp = int.from_bytes(code[i + 2:i + 6], "little", signed=True)
                i += 6
                jump, slot = True, base + i + disp             # jmp qword ptr [rip + X]
            elif op == 0xFF and code[i + 1] == 0x24 and code[i + 2] == 0x25 and jump_prefixes:
                slot = int.from_bytes(code[i + 3:i + 7], "little", signed=True) & (2**64 - 1)
                i += 7
                jump = True                                    # jmp qword ptr [X]
            elif op == 0xFF and code[i + 1] == 0x35 and not prefixes:
                i += 6                                         # push qword ptr [rip + X]
            elif op == 0x68 and not prefixes:
                i += 5                                         # push imm32
            elif op == 0xE9 and jump_prefixes:
                i += 5
                jump = True                                    # jmp rel32
            elif op == 0xEB and jump_prefixes:
                i += 2
                jump = True                                    # jmp rel8
            elif op == 0x90 and set(prefixes) <= {0x66}:
                i += 1
                padding = True                                 # nop, xchg ax, ax
            elif op == 0x0F and code[i + 1] == 0x1F and (code[i + 2] >> 3) & 7 == 0 and \
                    set(prefixes) <= {0x66, 0x2E}:
                i += 2 + _modrm_length(code, i + 2)
                padding = True                                 # nop with an operand
            elif op == 0xCC and not prefixes:
                i += 1
                padding = True                                 # int3
            else:
                raise _Unknown
            if i > end:
                raise _Unknown
            yield base + start, i - start, padding, jump, slot
    except IndexError:
        raise _Unknown from None


def _capstone_instructions(code: bytes, base: int):
    for address, size, mnemonic, op_str in _capstone().disasm_lite(code, base):
        yield (address, size, _is_padding(mnemonic), mnemonic.endswith("jmp"),
               _slot_of(address, size, mnemonic, op_str))


def find_plt_entries(sections, read, got_names: dict[int, str]) -> list[tuple[str, int, int]]:
    """Return ``[("name@plt", address, size)]`` for every PLT stub found
    (names can repeat: two IRELATIVE slots of the same IFUNC).

    *sections* is an iterable of objects with ``name``, ``address``, ``size``,
    ``offset`` and ``type``; *read(offset, size)* returns file bytes.  The
    stubs are decoded without capstone when they hold only the usual
    encodings (so that reading a trace does not need capstone); capstone
    decodes the rest.
    """
    result: list[tuple[str, int, int]] = []
    if not got_names:
        return result
    for sec in sections:
        if sec.name not in PLT_SECTIONS or sec.size == 0 or sec.type == 8:  # SHT_NOBITS
            continue
        code = read(sec.offset, sec.size)
        try:
            instructions = list(_stub_instructions(code, sec.address))
        except _Unknown:
            instructions = list(_capstone_instructions(code, sec.address))
        result += _stubs(instructions, sec.address + sec.size, got_names)
    return result


def _stubs(instructions, sec_end: int, got_names: dict[int, str]) -> list[tuple[str, int, int]]:
    stub_start = None
    found: list[tuple[int, str]] = []
    for address, _size, padding, jump, slot in instructions:
        if stub_start is None:
            if padding:
                continue
            stub_start = address
        if jump:
            if slot is not None and slot in got_names:
                found.append((stub_start, got_names[slot]))
            stub_start = None
    # size of a stub = distance to the next stub (or to the section end)
    return [(name + "@plt", start, (found[i + 1][0] if i + 1 < len(found) else sec_end) - start)
            for i, (start, name) in enumerate(found)]
