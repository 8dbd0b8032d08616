# SPDX-License-Identifier: GPL-2.0-or-later
"""Small x86-64 encoders for function copies (function_copy.py; the jmp/call
rel32 encoder is encode.py).

``REG`` numbers the 64-bit general registers (rax 0 ... r15 15);
``parent64(name)`` is the 64-bit register a capstone register name is part
of (``esi``, ``sil`` -> ``rsi``), or None (vector, segment, flags...).

``lea(dst, base, index, scale, disp)``: ``lea dst, [base + index*scale + disp]``
(registers as numbers, None for none); ``lea_rip(dst, at, target)``: the
RIP-relative form for code placed at ``at`` (None when out of reach);
``movabs(dst, value)``; ``store_rsp(disp, reg)`` / ``load_rsp(reg, disp)``:
``mov [rsp + disp], reg`` / ``mov reg, [rsp + disp]``; ``lea_rsp(delta)``.

``rebased(raw, modrm_at, text, reg) -> bytes | Refusal``: an instruction
with its one ModRM memory operand replaced by ``[reg]`` (no index, no
displacement); prefixes, opcode, other operands and immediates are kept,
segment and address-size prefixes dropped.  The caller decodes the result
again and checks it with ``rebase_problem(old, new, reg)`` (insn_entries.py
does it for many at once).
``operand_parts`` and ``same_operation``: the re-encoding and its check,
which redirect.py's ``redirect_operand`` (the operand on ``[rip + disp32]``)
shares.

``rip_operand(insn, raw) -> (disp offset, target) | str`` and
``rip_displaced(insn, raw, at) -> bytes | str``: an instruction with a
RIP-relative operand re-encoded for address ``at`` (its target unchanged),
or why not.
"""

from __future__ import annotations

import struct

from capstone import x86_const as X

from .relocate import Refusal

NAMES64 = ("rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
           "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
REG = {name: i for i, name in enumerate(NAMES64)}
_SUB = {}
for _i, (_d, _w, _b) in enumerate((("eax", "ax", "al"), ("ecx", "cx", "cl"), ("edx", "dx", "dl"),
                                   ("ebx", "bx", "bl"), ("esp", "sp", "spl"), ("ebp", "bp", "bpl"),
                                   ("esi", "si", "sil"), ("edi", "di", "dil"))):
    for _n in (_d, _w, _b):
        _SUB[_n] = NAMES64[_i]
for _n, _p in (("ah", "rax"), ("ch", "rcx"), ("dh", "rdx"), ("bh", "rbx")):
    _SUB[_n] = _p
for _i in range(8, 16):
    for _s in ("d", "w", "b"):
        _SUB[f"r{_i}{_s}"] = f"r{_i}"
HIGH_BYTE = frozenset({"ah", "bh", "ch", "dh"})


def parent64(name: str) -> str | None:
    if name in REG:
        return name
    return _SUB.get(name)


def _rex(w: int, r: int, x: int, b: int) -> int:
    return 0x40 | (w << 3) | ((r >> 3) << 2) | ((x >> 3) << 1) | (b >> 3)


def _i32(value: int) -> bool:
    return -(1 << 31) <= value < (1 << 31)


def _memory(reg: int, base: int | None, index: int | None, scale: int, disp: int) -> tuple[int, bytes]:
    """(REX X|B bits, ModRM + SIB + displacement) of [base + index*scale + disp]."""
    if not _i32(disp):
        raise ValueError("displacement out of 32-bit range")
    xb = ((index or 0) >> 3 << 1) | ((base or 0) >> 3)
    if base is None:
        sib = ({1: 0, 2: 1, 4: 2, 8: 3}[scale] << 6) | ((index if index is not None else 4) & 7) << 3 | 5
        return xb, bytes([(reg & 7) << 3 | 4, sib]) + struct.pack("<i", disp)
    if disp == 0 and base & 7 != 5:
        mod, tail = 0, b""
    elif -128 <= disp < 128:
        mod, tail = 1, struct.pack("<b", disp)
    else:
        mod, tail = 2, struct.pack("<i", disp)
    if index is None and base & 7 != 4:
        return xb, bytes([mod << 6 | (reg & 7) << 3 | (base & 7)]) + tail
    sib = ({1: 0, 2: 1, 4: 2, 8: 3}[scale or 1] << 6) | ((index if index is not None else 4) & 7) << 3 \
        | (base & 7)
    return xb, bytes([mod << 6 | (reg & 7) << 3 | 4, sib]) + tail


def lea(dst: int, base: int | None, index: int | None, scale: int, disp: int) -> bytes:
    xb, tail = _memory(dst, base, index, scale, disp)
    return bytes([_rex(1, dst, 0, 0) | xb, 0x8D]) + tail


def load(dst: int, base: int | None, index: int | None, scale: int, disp: int,
         segment: str | None = None) -> bytes:
    """``mov dst, qword ptr [base + index*scale + disp]`` (fs:/gs: with ``segment``)."""
    xb, tail = _memory(dst, base, index, scale, disp)
    prefix = {None: b"", "fs": b"\x64", "gs": b"\x65"}[segment]
    return prefix + bytes([_rex(1, dst, 0, 0) | xb, 0x8B]) + tail


def load_rip(dst: int, at: int, target: int) -> bytes | None:
    """``mov dst, qword ptr [rip + ...]`` at ``at`` reading ``target``."""
    disp = target - (at + 7)
    if not _i32(disp):
        return None
    return bytes([_rex(1, dst, 0, 0), 0x8B, (dst & 7) << 3 | 5]) + struct.pack("<i", disp)


def lea_rip(dst: int, at: int, target: int) -> bytes | None:
    disp = target - (at + 7)
    if not _i32(disp):
        return None
    return bytes([_rex(1, dst, 0, 0), 0x8D, (dst & 7) << 3 | 5]) + struct.pack("<i", disp)


def movabs(dst: int, value: int) -> bytes:
    return bytes([_rex(1, 0, 0, dst), 0xB8 | (dst & 7)]) + struct.pack("<Q", value & (2**64 - 1))


def store_rsp(disp: int, reg: int) -> bytes:
    xb, tail = _memory(reg, REG["rsp"], None, 1, disp)
    return bytes([_rex(1, reg, 0, 0) | xb, 0x89]) + tail


def load_rsp(reg: int, disp: int) -> bytes:
    xb, tail = _memory(reg, REG["rsp"], None, 1, disp)
    return bytes([_rex(1, reg, 0, 0) | xb, 0x8B]) + tail


def lea_rsp(delta: int) -> bytes:
    return lea(REG["rsp"], REG["rsp"], None, 1, delta)


# ------------------------------------------------ memory operands re-encoded
# The one re-encoder of an instruction's ModRM memory operand: the function
# copier puts it on [reg] (``rebased``), the data stubs on
# [rip + disp32] (redirect.py: ``redirect_operand``).
LEGACY_PREFIXES = frozenset({0xF0, 0xF2, 0xF3, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65, 0x66, 0x67})
DROPPED_PREFIXES = frozenset({0x64, 0x65, 0x67})


def modrm_tail(raw: bytes, modrm_at: int) -> tuple[int, int] | None:
    """(length of SIB + displacement after the ModRM byte, mod) or None."""
    modrm = raw[modrm_at]
    mod, rm = modrm >> 6, modrm & 7
    if mod == 3:
        return None
    length = 0
    if rm == 4:
        length += 1
        base = raw[modrm_at + 1] & 7
        if mod == 0 and base == 5:
            length += 4
    elif mod == 0 and rm == 5:
        length += 4
    length += {0: 0, 1: 1, 2: 4}[mod]
    return length, mod


def operand_parts(raw: bytes, modrm_at: int, text: str, b: int,
                  verb: str) -> tuple[bytes, bytes, bytes] | Refusal:
    """(legacy prefixes, REX/VEX/EVEX and opcode, immediate) of the instruction
    ``raw`` (``text``: its disassembly; its ModRM byte at ``modrm_at``,
    capstone's ``modrm_offset``) made ready for a new memory operand: segment
    and address-size prefixes dropped (the new operand is a plain address),
    the X bit cleared and the B bit set to ``b`` (the base register's high bit;
    a REX prefix added for it), the immediate that follows the operand kept.
    Or why not (``verb``: what is done to the instruction, for the reason)."""
    if modrm_at <= 0:
        return Refusal(f"'{text}' has no ModRM memory operand")
    pos = 0
    prefixes = bytearray()
    while pos < modrm_at and raw[pos] in LEGACY_PREFIXES:
        if raw[pos] not in DROPPED_PREFIXES:
            prefixes.append(raw[pos])
        pos += 1
    head = bytearray(raw[pos:modrm_at])
    if not head:
        return Refusal("no opcode before the ModRM byte")
    if 0x40 <= head[0] <= 0x4F:
        head[0] = (head[0] & ~0x03) | b
    elif head[0] == 0xC4 and len(head) >= 3:
        head[1] = (head[1] | 0x60) & ~(b << 5)        # VEX: X and B stored inverted
    elif head[0] == 0x62 and len(head) >= 5:
        head[1] = (head[1] | 0x60) & ~(b << 5)        # EVEX: as in VEX
    elif head[0] == 0xC5:
        if b:
            return Refusal("2-byte VEX has no B bit")
    elif head[0] == 0x8F:
        return Refusal(f"XOP encodings are not {verb}")
    elif b:
        head.insert(0, 0x41)                            # REX.B
    tail = modrm_tail(raw, modrm_at)
    if tail is None:
        return Refusal("register operand, not memory")
    return bytes(prefixes), bytes(head), raw[modrm_at + 1 + tail[0]:]


def same_operation(old, new, memory_ok, not_ok: str) -> str | None:
    """Why ``new`` (re-encoded, decoded again) is not ``old`` with its memory
    operand replaced (``memory_ok(new, operand)`` judges the new operand;
    ``not_ok`` says what is wrong otherwise), or None."""
    if new is None:
        return "re-encoding is undecodable"
    if new.mnemonic != old.mnemonic or len(new.operands) != len(old.operands):
        return f"re-encoded as '{new.mnemonic} {new.op_str}'"
    for a, b in zip(old.operands, new.operands):
        if a.type != b.type or a.size != b.size:
            return "operands differ after re-encoding"
        if a.type == X.X86_OP_MEM:
            if not memory_ok(new, b):
                return not_ok
        elif a.type == X.X86_OP_REG and a.reg != b.reg:
            return "register operand changed"
        elif a.type == X.X86_OP_IMM and a.imm != b.imm:
            return "immediate changed"
    return None


def rebased(raw: bytes, modrm_at: int, text: str, reg: int) -> bytes | Refusal:
    """The instruction ``raw`` (see ``operand_parts``) with its one ModRM memory
    operand replaced by ``[reg]`` (no index, no displacement); not checked yet
    (``rebase_problem``)."""
    parts = operand_parts(raw, modrm_at, text, reg >> 3, "rewritten")
    if isinstance(parts, Refusal):
        return parts
    prefixes, head, immediate = parts
    if reg & 7 in (4, 5):
        return Refusal("rsp/rbp/r12/r13 need a SIB byte or a displacement")
    out = prefixes + head + bytes([(raw[modrm_at] & 0x38) | (reg & 7)]) + immediate
    if len(out) > 15:
        return Refusal("re-encoded instruction would exceed 15 bytes")
    return out


def rebase_problem(old, new, reg: int) -> str | None:
    """Why ``new`` (``rebased``'s bytes, decoded again) is not ``old`` on [reg]."""
    def on_reg(insn, op) -> bool:
        return insn.reg_name(op.mem.base) == NAMES64[reg] and op.mem.index == X.X86_REG_INVALID \
            and op.mem.disp == 0 and op.mem.segment == X.X86_REG_INVALID

    return same_operation(old, new, on_reg, "memory operand not rebased")


# ------------------------------------------------------ RIP-relative operands
def rip_field(raw: bytes, disp_offset: int, disp: int | None) -> tuple[int, int] | str:
    """(offset of the disp32 in ``raw``, its value) of an instruction with a
    RIP-relative operand (capstone's ``disp_offset``; ``disp``: the first
    RIP-relative operand's displacement, None if there is none), or why it is
    not found (capstone's ``disp_size`` is wrong with a 66 prefix: the bytes
    are checked)."""
    d = disp_offset
    old = int.from_bytes(raw[d:d + 4], "little", signed=True) if d >= 1 else None
    if d < 1 or d + 4 > len(raw) or raw[d - 1] & 0xC7 != 0x05 or disp is None or old != disp:
        return "RIP-relative displacement not found"
    return d, old


def rip_operand(insn, raw: bytes) -> tuple[int, int] | str:
    """(offset of the disp32 in ``raw``, the address it reaches) of an instruction
    with a RIP-relative operand, or why it is not found."""
    ops = [op for op in insn.operands if op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RIP]
    found = rip_field(raw, insn.disp_offset, ops[0].mem.disp if ops else None)
    if isinstance(found, str):
        return found
    return found[0], insn.address + insn.size + found[1]


def rip_displaced(insn, raw: bytes, at: int) -> bytes | str:
    """``insn`` (capstone, detail on; ``raw`` its bytes) with its RIP-relative
    operand's displacement changed so that it runs at ``at`` with the same target."""
    found = rip_operand(insn, raw)
    if isinstance(found, str):
        return found
    d, target = found
    disp = target - (at + insn.size)
    if not _i32(disp):
        return f"{target:#x} out of reach from {at:#x}"
    return raw[:d] + struct.pack("<i", disp) + raw[d + 4:]
