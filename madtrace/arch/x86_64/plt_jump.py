# SPDX-License-Identifier: GPL-2.0-or-later
"""A PLT stub's jump, and its replacement that reads the GOT through an alias.

A PLT stub jumps through its GOT slot: ``jmp qword ptr [rip + X]`` (``FF 25``,
possibly after ``bnd`` (F2) or ``notrack`` (3E)).  When the GOT shares a page
with traced data (``.got.plt`` next to ``.data`` under partial RELRO, the
default of many distributions), every call through the PLT faults on that
page although it touches no traced byte.

``got_jump(code, address) -> (length, slot) | None``: the stub's jump at
``address`` (``code``: its bytes), with the address of the GOT slot it reads.

``aliased_jump(slot, bitmap_byte, bit, alias) -> bytes``: the same jump made
from madtrace's code area, reading the slot through its alias (``alias``)
when the alias bitmap's ``bit`` of byte ``bitmap_byte`` says the page is
aliased, else at its own address (the alias is gone: detach, tracer death, a
vfork window)::

    movabs r11, bitmap_byte
    test   byte ptr [r11], bit
    movabs r11, alias
    jnz    1f
    movabs r11, slot
 1: jmp    qword ptr [r11]

It uses r11 and the flags: both are free where a PLT stub runs (the System V
ABI makes r11 a scratch register that passes nothing at a call, and the
flags are not preserved across one; linkers' own PLT variants, e.g. lld's
retpoline PLT, use r11 the same way).
"""

from __future__ import annotations

import struct

_PREFIXES = (0xF2, 0x3E)


def got_jump(code: bytes, address: int) -> tuple[int, int] | None:
    i = 0
    while i < len(code) and code[i] in _PREFIXES and i < 2:
        i += 1
    if code[i:i + 2] != b"\xff\x25" or len(code) < i + 6:
        return None
    length = i + 6
    disp = struct.unpack_from("<i", code, i + 2)[0]
    return length, address + length + disp


def _movabs_r11(value: int) -> bytes:
    return b"\x49\xbb" + struct.pack("<Q", value)


def aliased_jump(slot: int, bitmap_byte: int, bit: int, alias: int) -> bytes:
    return (_movabs_r11(bitmap_byte) + b"\x41\xf6\x03" + bytes([1 << bit])
            + _movabs_r11(alias) + b"\x75\x0a" + _movabs_r11(slot) + b"\x41\xff\x23")
