# SPDX-License-Identifier: GPL-2.0-or-later
"""Shared capstone instances and a fast linear-sweep decoder.

``capstone_lite()`` / ``capstone_detail()``: cached ``Cs`` instances for
x86-64 (detail off / on).  Do not change their options.

``decode_one(code, addr, detail=True)``: the first instruction of *code*
(placed at *addr*) as a capstone ``CsInsn``, or None when undecodable.

``sweep(buf, base, start, end)``: linear sweep of ``buf[start:end]`` (a
``numpy.uint8`` array; ``buf[i]`` lives at address ``base + i``) with
capstone's C decoder called directly through ctypes, so that no Python object
is made per instruction.  Returns ``(offsets, sizes)``: ``numpy.int64`` byte
offsets into *buf* of every decoded instruction, and their lengths.  An
undecodable byte is skipped (it is not an instruction start), like objdump's
``(bad)``.  Roughly 0.1 us per instruction (libpython's 2.3 MB ``.text``,
571k instructions, in ~0.25 s) where ``Cs.disasm_lite`` needs ~0.7 us.
"""

from __future__ import annotations

import ctypes

import capstone
import numpy as np
from capstone import _cs, _cs_insn

_INSN_SIZE = ctypes.sizeof(_cs_insn)
# cs_insn: uint id; uint64 address; uint16 size; ... (see capstone.h)
_INSN_DTYPE = np.dtype({
    "names": ["address", "size"],
    "formats": ["<u8", "<u2"],
    "offsets": [_cs_insn.address.offset, _cs_insn.size.offset],
    "itemsize": _INSN_SIZE,
})
_CHUNK = 16384  # instructions per cs_disasm call (bounds the C-side buffer to ~4 MB)

_lite = None
_detail = None


def capstone_lite() -> capstone.Cs:
    global _lite
    if _lite is None:
        _lite = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        _lite.detail = False
    return _lite


def capstone_detail() -> capstone.Cs:
    global _detail
    if _detail is None:
        _detail = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        _detail.detail = True
    return _detail


def decode_one(code: bytes, addr: int, detail: bool = True):
    """The first instruction of *code* at *addr* (``CsInsn``) or None."""
    md = capstone_detail() if detail else capstone_lite()
    for insn in md.disasm(bytes(code[:16]), addr, 1):
        return insn
    return None


def as_buffer(code) -> np.ndarray:
    """*code* (bytes, bytearray, memoryview, mmap slice) as a contiguous uint8 array."""
    if isinstance(code, np.ndarray):
        return np.ascontiguousarray(code, dtype=np.uint8)
    return np.frombuffer(bytes(code), dtype=np.uint8)


def sweep(buf: np.ndarray, base: int, start: int = 0, end: int | None = None):
    """Linear sweep of ``buf[start:end]``; see the module docstring."""
    if end is None:
        end = len(buf)
    handle = capstone_lite().csh
    ptr = buf.ctypes.data
    out_off: list[np.ndarray] = []
    out_size: list[np.ndarray] = []
    insns = ctypes.POINTER(_cs_insn)()
    pos = start
    while pos < end:
        n = _cs.cs_disasm(handle, ctypes.cast(ptr + pos, ctypes.POINTER(ctypes.c_char)),
                          end - pos, base + pos, _CHUNK, ctypes.byref(insns))
        if n == 0:
            pos += 1  # undecodable byte (or an instruction cut by *end*)
            continue
        try:
            raw = (ctypes.c_char * (n * _INSN_SIZE)).from_address(
                ctypes.addressof(insns.contents))
            arr = np.frombuffer(raw, dtype=_INSN_DTYPE)
            offs = arr["address"].astype(np.int64) - base
            sizes = arr["size"].astype(np.int64)
        finally:
            _cs.cs_free(insns, n)
        out_off.append(offs)
        out_size.append(sizes)
        pos = int(offs[-1] + sizes[-1])
        if n < _CHUNK and pos < end:
            pos += 1  # capstone stopped on an undecodable byte
    if not out_off:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(out_off) == 1:
        return out_off[0], out_size[0]
    return np.concatenate(out_off), np.concatenate(out_size)
