# SPDX-License-Identifier: GPL-2.0-or-later
"""Unwind information for a relocated function (the hybrid data engine's copies).

A function moved into a code area (arch/x86_64/function_copy.py) runs calls
whose return addresses lie in the copy, where no module's ``.eh_frame`` says
anything: a C++ exception thrown below it, a thread cancellation or a
``backtrace()`` would stop there.  As for the call-site trampolines
(unwind.py), madtrace registers unwind information for the copy with the
target's unwinder, made from the original function's own:

* the CIE: the original's alignment factors, return address column and
  initial instructions; the personality routine and the LSDA pointer as
  absolute addresses (``DW_EH_PE_absptr``, the personality through its
  pointer when the original is indirect), so the bytes may live anywhere;
* the FDE covers the copy's code; its call frame instructions are the
  original's, with every advance of the location moved to the copy of the
  instruction it names (``old_to_new``: the copy keeps the original order of
  instructions, a probe sits just before its instruction and shares its row:
  rows inside a probe are never seen by an unwinder, since a thread is moved
  out of a probe before a signal handler runs; see data/hybrid/rewriting.py
  ``settle``);
* the LSDA (C++ exception tables): the call-site table moved to the copy
  (ranges and landing pads through ``old_to_new``; a landing pad outside the
  function, in a ``.cold`` part, stays where it is), encoded as absolute
  addresses (LPStart 0, ``udata8``); the action table as it is; the type
  table re-encoded as absolute addresses (pc-relative entries would point
  elsewhere once moved), the exception specifications after it as they are.

``copy_unwind(...) -> bytes | str``: one registrable object (CIE, FDE, the
terminator, then the LSDA), or why there is none: an advance into the middle
of an instruction, ``DW_CFA_set_loc``, an expression that reads the
instruction pointer (its value differs in the copy) or that madtrace does not
know, a code alignment other than 1.
"""

from __future__ import annotations

import struct
from typing import Callable

from ...binary.eh_frame import (DW_EH_PE_absptr, DW_EH_PE_indirect, DW_EH_PE_omit, DW_EH_PE_udata8,
                                ENCODED_SIZES, Cie, Fde, read_encoded, sleb, uleb)
from ...target.trampoline_unwind import _record, _sleb, _uleb

DW_CFA_advance_loc, DW_CFA_offset, DW_CFA_restore = 0x40, 0x80, 0xC0
DW_CFA_set_loc, DW_CFA_advance_loc1, DW_CFA_advance_loc2, DW_CFA_advance_loc4 = 1, 2, 3, 4
DW_CFA_def_cfa_expression, DW_CFA_expression, DW_CFA_val_expression = 0x0F, 0x10, 0x16
# operands of the other call frame instructions: u = ULEB128, s = SLEB128
_CFA_OPERANDS = {0x00: "", 0x05: "uu", 0x06: "u", 0x07: "u", 0x08: "u", 0x09: "uu", 0x0A: "",
                 0x0B: "", 0x0C: "uu", 0x0D: "u", 0x0E: "u", 0x11: "us", 0x12: "us", 0x13: "s",
                 0x14: "uu", 0x15: "us", 0x2E: "u", 0x2F: "uu", 0x2D: ""}
# DWARF expression operators whose value does not depend on where the code is:
# operator -> operands (1/2/4/8: bytes, u/s: LEB128)
_OPS: dict[int, str] = {0x06: "", 0x08: "1", 0x09: "1", 0x0A: "2", 0x0B: "2", 0x0C: "4", 0x0D: "4",
                        0x0E: "8", 0x0F: "8", 0x10: "u", 0x11: "s", 0x15: "1", 0x23: "u",
                        0x28: "2", 0x2F: "2", 0x90: "u", 0x91: "s", 0x92: "us", 0x94: "1",
                        0x96: ""}
_OPS.update({op: "" for op in (*range(0x12, 0x15), *range(0x16, 0x23), *range(0x24, 0x28),
                               *range(0x29, 0x2F), *range(0x30, 0x70))})
_OPS.update({op: "s" for op in range(0x70, 0x90)})
REG_RIP = 16
DW_OP_reg0, DW_OP_breg0, DW_OP_regx, DW_OP_bregx = 0x50, 0x70, 0x90, 0x92

Locate = Callable[[int], "int | None"]      # an original address -> its copy


def _leb(data: bytes, pos: int, kind: str) -> tuple[int, int]:
    return uleb(data, pos) if kind == "u" else sleb(data, pos)


def _expression_refusal(expr: bytes) -> str | None:
    """Why a DWARF expression cannot move with the code (None: it can)."""
    pos = 0
    while pos < len(expr):
        op = expr[pos]
        pos += 1
        if op not in _OPS:
            return f"DWARF operator {op:#x} in a call frame expression"
        if op in (DW_OP_reg0 + REG_RIP, DW_OP_breg0 + REG_RIP):
            return "a call frame expression reads the instruction pointer"
        for kind in _OPS[op]:
            if kind in "us":
                value, pos = _leb(expr, pos, kind)
                if op in (DW_OP_regx, DW_OP_bregx) and kind == "u" and value == REG_RIP:
                    return "a call frame expression reads the instruction pointer"
            else:
                pos += int(kind)
    return None


def translate_cfi(program: bytes, start: int, locate: Locate, code_align: int) -> bytes | str:
    """The call frame instructions ``program`` of a function at ``start``, each
    advance of the location moved to the copy (``locate``); or why not."""
    if code_align != 1:
        return f"code alignment factor {code_align}"
    out = bytearray()
    pos, loc = 0, start
    new_loc = locate(start)
    if new_loc is None:
        return "the function's start has no copy"
    while pos < len(program):
        op = program[pos]
        high, low = op & 0xC0, op & 0x3F
        begin = pos
        pos += 1
        delta = None
        if high == DW_CFA_advance_loc:
            delta = low
        elif high in (DW_CFA_offset, DW_CFA_restore):
            if high == DW_CFA_offset:
                _, pos = uleb(program, pos)
        elif op in (DW_CFA_advance_loc1, DW_CFA_advance_loc2, DW_CFA_advance_loc4):
            size = {DW_CFA_advance_loc1: 1, DW_CFA_advance_loc2: 2, DW_CFA_advance_loc4: 4}[op]
            delta = int.from_bytes(program[pos:pos + size], "little")
            pos += size
        elif op == DW_CFA_set_loc:
            return "DW_CFA_set_loc"
        elif op in (DW_CFA_def_cfa_expression, DW_CFA_expression, DW_CFA_val_expression):
            if op != DW_CFA_def_cfa_expression:
                _, pos = uleb(program, pos)
            length, pos = uleb(program, pos)
            why = _expression_refusal(program[pos:pos + length])
            if why:
                return why
            pos += length
        elif op in _CFA_OPERANDS:
            for kind in _CFA_OPERANDS[op]:
                _, pos = _leb(program, pos, kind)
        else:
            return f"call frame instruction {op:#x}"
        if delta is None:
            out += program[begin:pos]
            continue
        loc += delta
        moved = locate(loc)
        if moved is None or moved < new_loc:
            return f"a call frame row at {loc:#x}, inside an instruction or out of order"
        out += bytes([DW_CFA_advance_loc4]) + struct.pack("<I", moved - new_loc)
        new_loc = moved
    return bytes(out)


def _cie(cie: Cie, personality: int | None) -> bytes:
    """A CIE like the original's, with absolute encodings."""
    augmentation = "z" + ("P" if personality is not None else "") + "LR" + ("S" if cie.signal_frame else "")
    aug = b""
    if personality is not None:
        aug += bytes([DW_EH_PE_absptr]) + struct.pack("<Q", personality)
    aug += bytes([DW_EH_PE_absptr, DW_EH_PE_absptr])          # L: the LSDA pointer, R: the FDE's
    body = struct.pack("<I", 0) + bytes([1]) + augmentation.encode() + b"\0"
    body += _uleb(cie.code_align) + _sleb(cie.data_align) + bytes([cie.ra_column])
    body += _uleb(len(aug)) + aug + cie.instructions
    return _record(body)


def _fde(fde_offset: int, pc_begin: int, pc_end: int, lsda: int, program: bytes) -> bytes:
    body = struct.pack("<I", fde_offset + 4)       # back to the CIE at offset 0
    body += struct.pack("<QQ", pc_begin, pc_end - pc_begin)
    body += _uleb(8) + struct.pack("<Q", lsda) + program
    return _record(body)


class _Lsda:
    """The parts of an LSDA (read at its absolute address ``at``)."""

    def __init__(self, data: bytes, at: int, function_start: int):
        self.at = at
        pos = 0
        lp_enc = data[pos]
        pos += 1
        self.lp_start = function_start
        if lp_enc != DW_EH_PE_omit:
            self.lp_start, pos = read_encoded(data, pos, lp_enc, at + pos)
        self.ttype_enc = data[pos]
        pos += 1
        self.ttype_base = None
        if self.ttype_enc != DW_EH_PE_omit:
            offset, pos = uleb(data, pos)
            self.ttype_base = pos + offset
        cs_enc = data[pos]
        cs_len, pos = uleb(data, pos + 1)
        self.call_sites = []           # (start, length, landing pad, action), absolute addresses
        end = pos + cs_len
        while pos < end:
            start, pos = read_encoded(data, pos, cs_enc, at + pos)
            length, pos = read_encoded(data, pos, cs_enc, at + pos)
            pad, pos = read_encoded(data, pos, cs_enc, at + pos)
            action, pos = uleb(data, pos)
            self.call_sites.append((function_start + start, length, self.lp_start + pad if pad else 0,
                                    action))
        self.actions_start = pos
        # every action record reachable from a call site: the table's extent and the
        # type entries it names (positive filters, and the indices of exception
        # specifications, the negative filters)
        self.actions_end = pos
        types, specs_end = 0, 0
        todo = [self.actions_start + a - 1 for *_, a in self.call_sites if a]
        seen = set()
        while todo:
            record = todo.pop()
            if record in seen:
                continue
            seen.add(record)
            filt, p = sleb(data, record)
            disp_at = p
            disp, p = sleb(data, p)
            self.actions_end = max(self.actions_end, p)
            if filt > 0:
                types = max(types, filt)
            elif filt < 0 and self.ttype_base is not None:
                q = self.ttype_base - filt - 1
                while True:
                    index, q = uleb(data, q)
                    if not index:
                        break
                    types = max(types, index)
                specs_end = max(specs_end, q)
            if disp:
                todo.append(disp_at + disp)
        self.types = []
        if self.ttype_base is not None:
            size = ENCODED_SIZES[self.ttype_enc & 0x0F][0]
            for i in range(1, types + 1):
                entry = self.ttype_base - i * size
                value, _ = read_encoded(data, entry, self.ttype_enc & ~DW_EH_PE_indirect, at + entry)
                self.types.append(value)
        self.actions = data[self.actions_start:self.actions_end]
        self.specs = data[self.ttype_base:specs_end] if self.ttype_base is not None and specs_end else b""


def _lsda(parsed: _Lsda, function_start: int, copy_start: int, locate: Locate,
          function_end: int, code_end: int) -> bytes | str:
    """The LSDA of the copy (see the module)."""
    def moved(address: int) -> int | None:
        return code_end if address == function_end else locate(address)

    sites = bytearray()
    for start, length, pad, action in parsed.call_sites:
        new_start, new_end = moved(start), moved(start + length)
        if new_start is None or new_end is None:
            return f"a call-site range [{start:#x}, {start + length:#x}) does not move with the code"
        new_pad: int | None = 0
        if pad:
            new_pad = locate(pad) if function_start <= pad < function_end else pad
            if new_pad is None:
                return f"landing pad {pad:#x} inside an instruction"
        sites += struct.pack("<QQQ", new_start - copy_start, new_end - new_start, new_pad)
        sites += _uleb(action)
    head = bytes([DW_EH_PE_absptr]) + struct.pack("<Q", 0)     # LPStart 0: landing pads absolute
    tail = bytes([DW_EH_PE_udata8]) + _uleb(len(sites)) + sites + parsed.actions
    if parsed.ttype_base is None:
        return head + bytes([DW_EH_PE_omit]) + tail
    enc = (parsed.ttype_enc & DW_EH_PE_indirect) | DW_EH_PE_absptr
    types = b"".join(struct.pack("<Q", t) for t in reversed(parsed.types))
    # the type table ends at TTBase; its offset is counted from the end of its own ULEB128
    for width in range(1, 6):
        padding = (-(len(head) + 1 + width + len(tail))) % 8
        offset = len(tail) + padding + len(types)
        if len(_uleb(offset)) == width:
            break
    return head + bytes([enc]) + _uleb(offset) + tail + b"\0" * padding + types + parsed.specs


def copy_unwind(fde: Fde, bias: int, copy_start: int, code_end: int, locate: Locate,
                at: int, read_lsda: Callable[[int], bytes] | None,
                personality: int | None) -> bytes | str:
    """One registrable object for a copy at ``copy_start`` (its code up to
    ``code_end``) of the function ``fde`` describes (relative addresses, the
    module's load ``bias``), to live at ``at``; ``read_lsda(address)``: the
    bytes from the LSDA's absolute address on; ``personality``: the absolute
    address of the personality routine (None: none).  Or why not."""
    start, end = bias + fde.start, bias + fde.end
    program = translate_cfi(fde.instructions, start, locate, fde.cie.code_align)
    if isinstance(program, str):
        return program
    cie = _cie(fde.cie, personality)
    lsda = b""
    if fde.lsda:
        if read_lsda is None:
            return "no reader for the exception tables"
        moved = _lsda(_Lsda(read_lsda(bias + fde.lsda), bias + fde.lsda, start), start, copy_start,
                      locate, end, code_end)
        if isinstance(moved, str):
            return moved
        lsda = moved
    fde_size = len(_fde(len(cie), copy_start, code_end, 0, program))
    lsda_at = (at + len(cie) + fde_size + 4 + 7) & ~7 if lsda else 0
    out = cie + _fde(len(cie), copy_start, code_end, lsda_at, program) + struct.pack("<I", 0)
    if lsda:
        out += b"\0" * (lsda_at - at - len(out)) + lsda
    return out
