# SPDX-License-Identifier: GPL-2.0-or-later
"""The stub an indirect jump of a function copy becomes (function_copy.py).

The jump's target, translated: a target inside the function that the copy's
table maps (original offset -> copy offset, int32, -1 for none) goes to the
copy, any other stays.  Every register and flag is as before when it jumps::

    lea rsp, [rsp - FRAME]; mov [rsp], rax; mov [rsp + 8], rcx
    mov rax, <the jump's target>          (may fault: ``Stub.load``)
    mov [rsp + 16], rax; pushfq
    movabs rcx, -start; add rax, rcx; cmp rax, size; jae 1f
    movabs rcx, table; movsxd rax, [rcx + rax*4]; cmp rax, -1; je 1f
    movabs rcx, base; add rax, rcx; mov [rsp + 24], rax
    1: popfq; mov rcx, [rsp + 8]; mov rax, [rsp]; lea rsp, [rsp + FRAME]
    jmp [rsp - FRAME + 16]

``stub_refusal(insn)``: why a jump cannot take a stub (None: it can);
``target_load_size(insn)``: the size of its ``mov rax, <target>``;
``pushf_offset(code)``: where a stub's pushfq lies from its target's load
(``code``: the stub's bytes from the load on); a thread stopped up to there
has done nothing but lower rsp, save rax and rcx and load the target: it can
be put back at the jump.  (Single-stepping over the pushfq saves the trap flag
with the flags: the popfq then sets it for good and the thread, once
untraced, dies of SIGTRAP.)
``stub_template(insn, start, end) -> (bytes, fields, rip_target)``: the stub
with the fields that depend on where the copy is left zero: ``fields`` =
(offset of the target's load, of its RIP displacement or -1, of the table's
address, of the copy's address); ``rip_target`` is what a RIP-relative load
reads, from the jump's own address (0 if none).  ``target_load(insn, at)``: the load placed at ``at``.
"""

from __future__ import annotations

import struct

from capstone import x86_const as X

from .copy_encode import REG, lea_rsp, load, load_rip, load_rsp, movabs, parent64, store_rsp
from .decode import decode_one

FRAME = 128 + 24          # the red zone, then rax, rcx, the target
STUB_SIZE = 8 + 4 + 5 + 5 + 1 + 10 + 3 + 6 + 2 + 10 + 4 + 4 + 2 + 10 + 3 + 5 + 1 + 5 + 4 + 8 + 7


def stub_refusal(insn) -> str | None:
    op = insn.operands[0] if insn.operands else None
    if op is None:
        return "no target operand"
    if op.type == X.X86_OP_REG:
        return None if parent64(insn.reg_name(op.reg)) == insn.reg_name(op.reg) else "32-bit target"
    if op.type != X.X86_OP_MEM or op.size != 8:
        return "unusual target operand"
    base = insn.reg_name(op.mem.base) if op.mem.base else None
    index = insn.reg_name(op.mem.index) if op.mem.index else None
    if (base and base != "rip" and base not in REG) or (index and index not in REG):
        return "32-bit address"
    return None


def target_load_size(insn) -> int:
    op = insn.operands[0]
    if op.type == X.X86_OP_REG:
        return 3
    if op.mem.base == X.X86_REG_RIP:
        return 7
    loaded = target_load(insn, 0)
    assert loaded is not None         # only a RIP-relative load can be out of reach
    return len(loaded)


def target_load(insn, at: int) -> bytes | None:
    """``mov rax, <the jump's target>`` placed at ``at`` (rsp lowered by FRAME)."""
    op = insn.operands[0]
    if op.type == X.X86_OP_REG:
        reg = REG[insn.reg_name(op.reg)]        # the source is ModRM.reg: REX.R extends it
        return bytes([0x48 | (reg >> 3) << 2, 0x89, 0xC0 | (reg & 7) << 3])   # mov rax, reg
    if op.mem.base == X.X86_REG_RIP:
        return load_rip(REG["rax"], at, insn.address + insn.size + op.mem.disp)
    base = insn.reg_name(op.mem.base) if op.mem.base else None
    index = insn.reg_name(op.mem.index) if op.mem.index else None
    disp = op.mem.disp + (FRAME if base == "rsp" else 0)
    segment = {X.X86_REG_FS: "fs", X.X86_REG_GS: "gs"}.get(op.mem.segment)
    return load(REG["rax"], REG[base] if base else None, REG[index] if index else None,
                op.mem.scale or 1, disp, segment)


def pushf_offset(code: bytes) -> int:
    loaded = decode_one(code, 0, detail=False)
    if loaded is None:
        raise ValueError("not a jump stub's target load")
    return loaded.size + len(store_rsp(16, REG["rax"]))


def stub_template(insn, start: int, end: int) -> tuple[bytes, tuple[int, int, int, int], int]:
    out = bytearray(lea_rsp(-FRAME) + store_rsp(0, REG["rax"]) + store_rsp(8, REG["rcx"]))
    load_at = len(out)
    op = insn.operands[0]
    rip_field, rip_target = -1, 0
    if op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RIP:
        rip_target = insn.size + op.mem.disp        # from the jump's address
        loaded = load_rip(REG["rax"], 0, 7)                  # mov rax, [rip + disp32]
        rip_field = load_at + 3
    else:
        loaded = target_load(insn, 0)
    assert loaded is not None
    out += loaded
    out += store_rsp(16, REG["rax"]) + b"\x9c"                        # pushfq
    out += movabs(REG["rcx"], -start) + b"\x48\x01\xc8"               # add rax, rcx
    out += b"\x48\x3d" + struct.pack("<i", end - start) + b"\x73"     # cmp rax, size; jae
    skip = len(out)
    out += b"\x00"
    table_field = len(out) + 2
    out += movabs(REG["rcx"], 0) + b"\x48\x63\x04\x81"                # movsxd rax, [rcx+rax*4]
    out += b"\x48\x83\xf8\xff\x74"                                    # cmp rax, -1; je
    skip2 = len(out)
    out += b"\x00"
    base_field = len(out) + 2
    out += movabs(REG["rcx"], 0) + b"\x48\x01\xc8" + store_rsp(24, REG["rax"])
    out[skip] = len(out) - skip - 1
    out[skip2] = len(out) - skip2 - 1
    out += b"\x9d" + load_rsp(REG["rcx"], 8) + load_rsp(REG["rax"], 0) + lea_rsp(FRAME)
    out += b"\xff\xa4\x24" + struct.pack("<i", 16 - FRAME)            # jmp [rsp - FRAME + 16]
    return bytes(out), (load_at, rip_field, table_field, base_field), rip_target
