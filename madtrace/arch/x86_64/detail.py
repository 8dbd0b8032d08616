# SPDX-License-Identifier: GPL-2.0-or-later
"""Capstone's instruction detail read from its C structures, in bulk.

capstone's Python binding builds a ``CsInsn`` and, on first use, copies its
detail into Python objects (``__gen_detail``: ~40 µs an instruction); a
function copy needs a few fields of each instruction.  ``decode(code,
address)`` calls ``cs_disasm`` once (detail on, like ``capstone_detail()``:
it stops at the first undecodable byte, as ``Cs.disasm`` does) and copies
each instruction's ``cs_detail`` into one numpy array, read through a dtype
built from the binding's own ctypes layouts: no Python object per
instruction.  ``Decoded`` holds the columns:

* ``address``, ``size``, ``id``: per instruction (numpy);
* ``groups``: ``(n, 8)`` group ids; ``has_group(group)``: a boolean column;
* ``op_count`` and ``(n, 8)`` operand columns ``op_type``, ``op_reg``,
  ``op_imm``, ``op_size``, ``op_access``, ``mem_segment``, ``mem_base``,
  ``mem_index``, ``mem_scale``, ``mem_disp``;
* ``modrm_offset``, ``disp_offset``, ``imm_size``;
* ``mnemonic(i)`` / ``op_str(i)``: text, decoded on demand;
* ``regs_read``, ``regs_write`` (and their ``_count``): the implicit
  registers, in the ``cs_detail`` array ``detail``;
* ``view(i)``: instruction ``i`` with the attributes of capstone's
  ``CsInsn`` that madtrace reads (``address``, ``size``, ``id``,
  ``mnemonic``, ``op_str``, ``groups``, ``operands`` with ``type``, ``reg``,
  ``imm``, ``size``, ``access`` and ``mem``, ``reg_name``, ``regs_access``,
  ``modrm_offset``, ``disp_offset``, ``imm_size``), made only when asked.

``REG_NAMES[id]``: capstone's name of a register id ("" for none).
"""

from __future__ import annotations

import ctypes

import numpy as np
from capstone import _cs, _cs_detail, _cs_insn
from capstone import x86_const as X
from capstone.x86 import CsX86, CsX86Encoding, X86Op, X86OpMem

from .decode import capstone_detail


def _field(struct, name: str) -> int:
    return getattr(struct, name).offset


_X86 = _field(_cs_detail, "arch")
_OPS = _X86 + _field(CsX86, "operands")
_VALUE = _field(X86Op, "value")
_ENC = _X86 + _field(CsX86, "encoding")
_OP_SIZE = ctypes.sizeof(X86Op)
_COPIED = _ENC + ctypes.sizeof(CsX86Encoding)     # the bytes of cs_detail read

_names: list[str] = []
_formats: list = []
_offsets: list[int] = []


def _add(name: str, fmt, offset: int) -> None:
    _names.append(name)
    _formats.append(fmt)
    _offsets.append(offset)


_add("regs_read", ("<u2", 20), _field(_cs_detail, "regs_read"))
_add("regs_read_count", "u1", _field(_cs_detail, "regs_read_count"))
_add("regs_write", ("<u2", 20), _field(_cs_detail, "regs_write"))
_add("regs_write_count", "u1", _field(_cs_detail, "regs_write_count"))
_add("groups", ("u1", 8), _field(_cs_detail, "groups"))
_add("groups_count", "u1", _field(_cs_detail, "groups_count"))
_add("op_count", "u1", _X86 + _field(CsX86, "op_count"))
for _name, _fmt, _off in (("op_type", "<u4", _field(X86Op, "type")),
                          ("op_reg", "<u4", _VALUE),
                          ("op_imm", "<i8", _VALUE),
                          ("mem_segment", "<u4", _VALUE + _field(X86OpMem, "segment")),
                          ("mem_base", "<u4", _VALUE + _field(X86OpMem, "base")),
                          ("mem_index", "<u4", _VALUE + _field(X86OpMem, "index")),
                          ("mem_scale", "<i4", _VALUE + _field(X86OpMem, "scale")),
                          ("mem_disp", "<i8", _VALUE + _field(X86OpMem, "disp")),
                          ("op_size", "u1", _field(X86Op, "size")),
                          ("op_access", "u1", _field(X86Op, "access"))):
    _add(_name, np.dtype((np.dtype({"names": ["v"], "formats": [_fmt], "offsets": [_off],
                                     "itemsize": _OP_SIZE}), (8,))), _OPS)
for _name in ("modrm_offset", "disp_offset", "imm_size"):
    _add(_name, "u1", _ENC + _field(CsX86Encoding, _name))
DETAIL = np.dtype({"names": _names, "formats": _formats, "offsets": _offsets,
                   "itemsize": _COPIED})
INSN = np.dtype({"names": ["id", "address", "size", "mnemonic", "op_str", "detail"],
                 "formats": ["<u4", "<u8", "<u2", "S32", "S160", "<u8"],
                 "offsets": [_field(_cs_insn, n) for n in ("id", "address", "size", "mnemonic",
                                                            "op_str", "detail")],
                 "itemsize": ctypes.sizeof(_cs_insn)})


def _reg_names() -> list[str]:
    handle = capstone_detail().csh
    out = []
    for reg in range(X.X86_REG_ENDING):
        name = _cs.cs_reg_name(handle, reg)
        out.append(name.decode() if name else "")
    return out


REG_NAMES = _reg_names()
_OPERAND_COLUMNS = frozenset({"op_type", "op_reg", "op_imm", "mem_segment", "mem_base", "mem_index",
                              "mem_scale", "mem_disp", "op_size", "op_access"})
_memmove = ctypes.memmove


class MemView:
    __slots__ = ("segment", "base", "index", "scale", "disp")

    def __init__(self, segment: int, base: int, index: int, scale: int, disp: int):
        self.segment, self.base, self.index, self.scale, self.disp = segment, base, index, scale, disp


class OperandView:
    __slots__ = ("type", "reg", "imm", "size", "access", "mem")

    def __init__(self, kind: int, reg: int, imm: int, size: int, access: int, mem: MemView):
        self.type, self.reg, self.imm, self.size, self.access, self.mem = \
            kind, reg, imm, size, access, mem


class InsnView:
    """One decoded instruction seen as capstone's ``CsInsn`` (see the module)."""

    __slots__ = ("address", "size", "id", "mnemonic", "op_str", "groups", "operands",
                 "modrm_offset", "disp_offset", "imm_size")
    address: int
    size: int
    id: int
    mnemonic: str
    op_str: str
    groups: list[int]
    operands: list[OperandView]
    modrm_offset: int
    disp_offset: int
    imm_size: int

    def reg_name(self, reg: int, default=None):
        return REG_NAMES[reg] or default


class Decoded:
    """The instructions of one piece of code (see the module docstring)."""

    def __init__(self, insns: np.ndarray, detail: np.ndarray):
        self.n = len(insns)
        self.address = insns["address"].astype(np.int64)
        self.size = insns["size"].astype(np.int64)
        self.id = insns["id"].astype(np.int64)
        self._mnemonic = insns["mnemonic"]
        self._op_str = insns["op_str"]
        self.groups = detail["groups"]
        self.groups_count = detail["groups_count"]
        self.op_count = detail["op_count"]
        self.modrm_offset = detail["modrm_offset"]
        self.disp_offset = detail["disp_offset"]
        self.imm_size = detail["imm_size"]
        self.detail = detail

    def __getattr__(self, name: str):
        """An operand column (``op_type`` ...), read on first use; operands past
        ``op_count`` are left as capstone wrote them: their type reads 0."""
        if name not in _OPERAND_COLUMNS:
            raise AttributeError(name)
        column = self.detail[name]["v"]
        if name == "op_type":
            column = np.where(np.arange(8)[None, :] < self.op_count[:, None], column, 0)
        setattr(self, name, column)
        return column

    def has_group(self, group: int) -> np.ndarray:
        in_count = np.arange(8)[None, :] < self.groups_count[:, None]
        return ((self.groups == group) & in_count).any(axis=1)

    def mnemonic(self, i: int) -> str:
        return self._mnemonic[i].split(b"\0", 1)[0].decode()

    def op_str(self, i: int) -> str:
        return self._op_str[i].split(b"\0", 1)[0].decode()

    def view(self, i: int) -> InsnView:
        v = InsnView()
        v.address = int(self.address[i])
        v.size = int(self.size[i])
        v.id = int(self.id[i])
        v.mnemonic = self.mnemonic(i)
        v.op_str = self.op_str(i)
        v.groups = self.groups[i, :self.groups_count[i]].tolist()
        count = int(self.op_count[i])
        rows = zip(self.op_type[i, :count].tolist(), self.op_reg[i, :count].tolist(),
                   self.op_imm[i, :count].tolist(), self.op_size[i, :count].tolist(),
                   self.op_access[i, :count].tolist(), self.mem_segment[i, :count].tolist(),
                   self.mem_base[i, :count].tolist(), self.mem_index[i, :count].tolist(),
                   self.mem_scale[i, :count].tolist(), self.mem_disp[i, :count].tolist())
        v.operands = [OperandView(kind, reg, imm, size, access,
                                  MemView(seg, base, index, scale, disp))
                      for kind, reg, imm, size, access, seg, base, index, scale, disp in rows]
        v.modrm_offset = int(self.modrm_offset[i])
        v.disp_offset = int(self.disp_offset[i])
        v.imm_size = int(self.imm_size[i])
        return v

def decode(code: bytes, address: int, count: int = 0) -> Decoded:
    """``code`` (placed at ``address``) decoded up to its first undecodable byte
    (at most ``count`` instructions when not 0)."""
    handle = capstone_detail().csh
    raw = ctypes.POINTER(_cs_insn)()
    n = _cs.cs_disasm(handle, code, len(code), address, count, ctypes.byref(raw))
    if n <= 0:
        return Decoded(np.zeros(0, INSN), np.zeros(0, DETAIL))
    try:
        base = ctypes.addressof(raw.contents)
        insns = np.frombuffer((ctypes.c_char * (n * INSN.itemsize)).from_address(base),
                              dtype=INSN).copy()
        detail = np.empty(n, DETAIL)
        to = detail.ctypes.data
        for k, pointer in enumerate(insns["detail"].tolist()):
            _memmove(to + k * _COPIED, pointer, _COPIED)
    finally:
        _cs.cs_free(raw, n)
    return Decoded(insns, detail)

