# SPDX-License-Identifier: GPL-2.0-or-later
"""Relocation of a function's first instructions into a trampoline.

API
---
``relocate_entry(code, func_addr, func_size, new_addr, min_len=5)
-> Relocation | Refusal``
    *code* holds the function's bytes from *func_addr* (absolute addresses;
    at least *func_size* bytes are used when available).  The first whole
    instructions covering at least *min_len* bytes are re-encoded to run at
    *new_addr*; the caller appends ``jmp func_addr + consumed``
    (``encode_jmp``).  Re-encoded: RIP-relative memory operands (new disp32
    must fit), ``call``/``jmp`` rel8/rel32 (to rel32), ``jcc`` rel8/rel32 (to
    ``0F 8x rel32``), ``loop``/``jrcxz`` (to ``jrcxz +2; jmp +5; jmp rel32``).
    Everything else, ``endbr64`` included, is copied.
    Refused: ``ret``/``iret``, ``int``/``int3``/``ud2``/``hlt``, indirect
    ``jmp``, ``xbegin``, a ``66``-prefixed relative branch, an undecodable
    instruction, a prologue running past ``func_size``, a function shorter
    than *min_len*, a target out of rel32 range, and any direct branch of the
    function (linear sweep of *func_size* bytes) whose target is strictly
    inside ``(func_addr, func_addr + consumed)``.  With *branches_into*
    (``f(lo, hi) -> [(source, target)]``, absolute, e.g. from
    ``CallSiteScan.branches_into`` shifted by the bias) that sweep is skipped
    and the branches it reports refuse instead (notes on indirect jumps and
    branches back to the entry are then not produced).
``Relocation(consumed, code, notes, instructions, moved)``: ``consumed`` original
    bytes replaced by ``code`` (bytes, for *new_addr*); ``notes`` (tuple of
    str) records what was rewritten and what could not be checked (indirect
    jumps of the function; branches back to *func_addr* itself, which re-enter
    the patched entry); ``instructions``: ``(address, size, text)`` of the
    relocated originals; ``moved``: ``(new address, original address, new
    size)`` of each, so that what runs at the new address can be named by the
    original (an access made by a relocated instruction).  Truthy.
``Refusal(reason)``: falsy, ``reason`` is a sentence.
``encode_jmp(src, dst) / encode_call(src, dst) -> bytes | None``: a 5-byte
    ``E9``/``E8 rel32`` at *src* reaching *dst*, None when out of range.
``decode_one(code, addr)`` (from ``decode``): one capstone instruction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from capstone import CS_GRP_BRANCH_RELATIVE, CS_GRP_INT, CS_GRP_IRET, CS_GRP_JUMP, CS_GRP_RET
from capstone import x86_const as X

from .callsites import _branches
from .decode import as_buffer, decode_one, sweep
from .encode import encode_call, encode_jmp
from .encode import rel32 as _rel32

__all__ = ["Relocation", "Refusal", "relocate_entry", "encode_jmp", "encode_call", "decode_one"]

_REFUSED_IDS = {X.X86_INS_UD2: "ud2", X.X86_INS_UD1: "ud1", X.X86_INS_UD0: "ud0",
                X.X86_INS_HLT: "hlt", X.X86_INS_XBEGIN: "xbegin (relative abort target)",
                X.X86_INS_XABORT: "xabort"}
_ALLOWED_INT = {X.X86_INS_SYSCALL}
_LOOPS = {X.X86_INS_JRCXZ, X.X86_INS_JECXZ, X.X86_INS_JCXZ,
          X.X86_INS_LOOP, X.X86_INS_LOOPE, X.X86_INS_LOOPNE}


@dataclass(frozen=True)
class Relocation:
    consumed: int
    code: bytes
    notes: tuple = ()
    instructions: tuple = ()
    moved: tuple = ()

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True)
class Refusal:
    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.reason



def branch_head(raw: bytes, imm_size: int, loop: bool, text: str) -> bytes | str:
    """A relative branch (``raw``, its ``imm_size``, a ``loop``/``jrcxz`` or not;
    ``text``: its disassembly) re-encoded up to the rel32 that ends it: a rel32
    ``jmp``/``call``/``jcc``, or ``loop``/``jrcxz +2; jmp +5; jmp`` (then the
    rel32); or why it cannot be."""
    op_pos = len(raw) - imm_size - 1
    opcode = raw[op_pos]
    if imm_size == 4 and op_pos >= 1 and raw[op_pos - 1] == 0x0F and 0x80 <= opcode <= 0x8F:
        op_pos -= 1
    prefixes = raw[:op_pos]
    if 0x66 in prefixes:
        return "66-prefixed relative branch (operand size differs between CPUs)"
    if loop:
        return prefixes + bytes([opcode, 0x02, 0xEB, 0x05, 0xE9])
    if raw[op_pos] == 0x0F:                       # jcc rel32
        return prefixes + bytes([0x0F, raw[op_pos + 1]])
    if 0x70 <= opcode <= 0x7F:                    # jcc rel8
        return prefixes + bytes([0x0F, 0x80 | (opcode & 0xF)])
    if opcode in (0xE9, 0xEB):                    # jmp
        return prefixes + b"\xE9"
    if opcode == 0xE8:                            # call
        return prefixes + b"\xE8"
    return f"unsupported relative branch {text}"


def relocate_entry(code: bytes, func_addr: int, func_size: int, new_addr: int,
                   min_len: int = 5, branches_into=None) -> Relocation | Refusal:
    """See the module docstring."""
    size = min(func_size, len(code)) if func_size else len(code)
    if size < min_len:
        return Refusal(f"function is {size} bytes long, shorter than the {min_len} bytes to patch")
    pieces = _prologue(code, func_addr, size, min_len)
    if isinstance(pieces, Refusal):
        return pieces
    out = bytearray()
    notes: list[str] = []
    insns = []
    moved = []
    for addr, isize, text, raw, head, target in pieces:
        at = new_addr + len(out)
        if head is not None:                    # a relative branch, re-encoded to rel32
            r = _rel32(at + len(head) + 4, target)
            if r is None:
                return Refusal(f"target of '{text}' at {addr:#x} is out of rel32 range from {at:#x}")
            notes.append(f"{addr:#x} {text}: re-encoded as a rel32 branch")
            out += head + r
        elif target is not None:                # RIP-relative: the disp32 at ``raw[d:d + 4]``
            d = raw[0]
            disp = _rel32(at + isize, target)
            if disp is None:
                return Refusal(f"RIP-relative '{text}' at {addr:#x}: {target:#x} is out of "
                               f"disp32 range from {at:#x}")
            body = raw[1:]
            out += body[:d] + disp + body[d + 4:]
            notes.append(f"{addr:#x} {text}: RIP displacement adjusted")
        else:
            out += raw
        insns.append((addr, isize, text))
        moved.append((at, addr, new_addr + len(out) - at))
    consumed = sum(p[1] for p in pieces)

    if branches_into is not None:
        for src, tgt in branches_into(func_addr, func_addr + consumed):
            return Refusal(f"branch at {src:#x} targets {tgt:#x}, "
                           f"inside the relocated first {consumed} bytes")
        return Relocation(consumed, bytes(out), tuple(notes), tuple(insns), tuple(moved))
    return _with_sweep(code, func_addr, size, consumed, out, notes, insns, moved)


# the decoded prologues (what does not depend on where they go), by their bytes and
# address: a live session decodes them while the target runs (``relocate_entry`` at
# any address), and the patching, with every thread stopped, only re-encodes them
_prologues: dict = {}
_PROLOGUES_MAX = 8192


def _prologue(code, func_addr: int, size: int, min_len: int):
    """[(address, size, text, raw, branch head or None, target or None)] of the
    instructions covering ``min_len`` bytes (a RIP-relative one: ``raw`` is the
    displacement's offset byte, then the bytes), or a Refusal."""
    key = (bytes(code[:min_len + 32]), func_addr, size, min_len)   # all the decoding reads
    found = _prologues.get(key)
    if found is None:
        found = _decode_prologue(code, func_addr, size, min_len)
        if len(_prologues) >= _PROLOGUES_MAX:
            _prologues.clear()
        _prologues[key] = found
    return found


def _decode_prologue(code, func_addr: int, size: int, min_len: int):
    head = bytes(code[:min(size, min_len + 32)])
    pieces: list[tuple] = []
    pos = 0
    while pos < min_len:
        addr = func_addr + pos
        insn = decode_one(head[pos:pos + 16], addr)
        if insn is None and decode_one(bytes(code[pos:pos + 16]), addr) is not None:
            return Refusal(f"instruction at {addr:#x} runs past the end of the function")
        if insn is None:
            return Refusal(f"undecodable instruction at {addr:#x} in the first {min_len} bytes")
        if pos + insn.size > size:
            return Refusal(f"instruction at {addr:#x} runs past the end of the function")
        text = f"{insn.mnemonic} {insn.op_str}".strip()
        raw = head[pos:pos + insn.size]
        groups = set(insn.groups)
        if groups & {CS_GRP_RET, CS_GRP_IRET}:
            return Refusal(f"'{text}' at {addr:#x} is within the first {min_len} bytes")
        if CS_GRP_INT in groups and insn.id not in _ALLOWED_INT:
            return Refusal(f"'{text}' at {addr:#x} is within the first {min_len} bytes")
        if insn.id in _REFUSED_IDS:
            return Refusal(f"'{text}' at {addr:#x} ({_REFUSED_IDS[insn.id]}) cannot be relocated")
        if CS_GRP_BRANCH_RELATIVE in groups:
            branch = branch_head(raw, insn.imm_size, insn.id in _LOOPS, text)
            if isinstance(branch, str):
                return Refusal(f"'{text}' at {addr:#x}: {branch}")
            pieces.append((addr, insn.size, text, raw, branch, insn.operands[0].imm))
        elif CS_GRP_JUMP in groups:
            return Refusal(f"indirect jump '{text}' at {addr:#x} is within the first {min_len} bytes")
        else:
            rip_ops = [op for op in insn.operands
                       if op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RIP]
            if rip_ops:
                # RIP-relative is always modrm mod=00 rm=101 + disp32 (capstone's
                # disp_size is wrong with a 66 prefix, so check the bytes)
                d = insn.disp_offset
                old = int.from_bytes(raw[d:d + 4], "little", signed=True) if d >= 1 else None
                if d < 1 or d + 4 > len(raw) or raw[d - 1] & 0xC7 != 0x05 or old != rip_ops[0].mem.disp:
                    return Refusal(f"RIP-relative '{text}' at {addr:#x}: displacement not found")
                pieces.append((addr, insn.size, text, bytes([d]) + raw, None,
                               addr + insn.size + old))
            else:
                pieces.append((addr, insn.size, text, raw, None, None))
        pos += insn.size
    return tuple(pieces)


def _with_sweep(code, func_addr: int, size: int, consumed: int, out, notes, insns, moved):
    # branches of the whole function into the relocated range
    buf = np.zeros(size + 16, np.uint8)
    buf[:size] = as_buffer(bytes(code[:size]))
    offs, sizes = sweep(buf, func_addr, 0, size)
    o, _p, _k, _s, t = _branches(buf, offs, sizes)
    inside = (t > 0) & (t < consumed)
    if inside.any():
        i = int(np.nonzero(inside)[0][0])
        return Refusal(f"branch at {func_addr + int(o[i]):#x} targets {func_addr + int(t[i]):#x}, "
                       f"inside the relocated first {consumed} bytes")
    back = int(np.count_nonzero(t == 0))
    if back:
        notes.append(f"{back} branch(es) back to the entry {func_addr:#x} re-enter the patch")
    b0 = buf[offs]
    b1 = buf[offs + 1]
    # FF /4 /5 (possibly after a REX or notrack/bnd prefix)
    ind = ((b0 == 0xFF) & (((b1 >> 3) & 7) >= 4) & (((b1 >> 3) & 7) <= 5))
    pfx = np.isin(b0, [0x3E, 0xF2] + list(range(0x40, 0x50)))
    b2 = buf[offs + 2]
    ind |= pfx & (b1 == 0xFF) & (((b2 >> 3) & 7) >= 4) & (((b2 >> 3) & 7) <= 5)
    n_ind = int(np.count_nonzero(ind))
    if n_ind:
        notes.append(f"{n_ind} indirect jump(s) in the function: their targets were not checked")
    return Relocation(consumed, bytes(out), tuple(notes), tuple(insns), tuple(moved))
