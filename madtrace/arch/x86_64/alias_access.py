# SPDX-License-Identifier: GPL-2.0-or-later
"""An instruction re-encoded to carry out its access through the alias, from a
data slot (the fault path of the hybrid data engine: data/fault/stubs.py).

``alias_access(code, address, at, saved, pointer) -> AliasAccess | Refusal``:
the instruction at ``address`` (its bytes in ``code``), for execution at
``at``, as

    mov [rip -> saved], rA      ; a register the instruction does not use
    mov rA, [rip -> pointer]    ; the operand's address in the alias (the tracer
                                ; writes it into the slot at each fault)
    <the instruction on [rA]>
    mov rA, [rip -> saved]

``saved`` and ``pointer`` are 8-byte words of the thread's slot.  None of
these movs changes the flags and none uses the stack, so a thread stopped
anywhere in it is moved back (``rA`` from ``saved``) or on.  The access
itself is then one instruction on the shared memory, as a probe's is: a
store is in memory as soon as it ran (no write-back at the tracer's next
stop, which relocated code reading the alias would not wait for) and a
locked instruction stays atomic with respect to every other thread.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .copy_encode import HIGH_BYTE, REG, load_rip, parent64, rebase_problem, rebased
from .decode import decode_one
from .relocate import Refusal

# rbp/r12/r13 and rsp would need a SIB byte or a displacement in [rA]
CHOICES = ("rsi", "rdi", "rbx", "rax", "rcx", "rdx", "r8", "r9", "r10", "r11", "r14", "r15")
LOW_CHOICES = ("rsi", "rdi", "rbx", "rax", "rcx", "rdx")   # no REX.B: high bytes, 2-byte VEX


@dataclass(frozen=True)
class AliasAccess:
    code: bytes
    reg: str          # the register that holds the alias address
    insn_at: int      # offset of the re-encoded instruction in ``code``
    insn_end: int     # offset just after it (the restore of ``reg`` follows)


def store_rip(reg: int, at: int, target: int) -> bytes | None:
    """``mov qword ptr [rip + ...], reg`` at ``at`` writing ``target``."""
    disp = target - (at + 7)
    if not -(1 << 31) <= disp < (1 << 31):
        return None
    return bytes([0x48 | (reg >> 3) << 2, 0x89, (reg & 7) << 3 | 5]) + struct.pack("<i", disp)


def rebase_operand(insn, raw: bytes, address: int, reg: int) -> bytes | Refusal:
    """``insn`` (its bytes ``raw``, at ``address``) on ``[reg]``, checked by
    decoding it again."""
    text = f"{insn.mnemonic} {insn.op_str}"
    out = rebased(raw, insn.modrm_offset, text, reg)
    if isinstance(out, Refusal):
        return out
    problem = rebase_problem(insn, decode_one(out, address), reg)
    if problem:
        return Refusal(f"'{text}' at {address:#x}: {problem}")
    return out


def free_register(insn, raw: bytes) -> str | None:
    """A general register the instruction neither reads nor writes (explicitly or
    implicitly), usable as ``[reg]``."""
    try:
        read, written = insn.regs_access()
    except Exception:   # capstone cannot tell: assume the worst
        return None
    names = {insn.reg_name(r) for r in (*read, *written)}
    used = {parent64(n) for n in names if parent64(n)}
    low = bool(names & HIGH_BYTE) or any(b == 0xC5 for b in raw[:4])
    return next((r for r in (LOW_CHOICES if low else CHOICES) if r not in used), None)


def alias_access(code: bytes, address: int, at: int, saved: int, pointer: int) -> AliasAccess | Refusal:
    insn = decode_one(code, address)
    if insn is None:
        return Refusal(f"undecodable instruction at {address:#x}")
    raw = bytes(code[:insn.size])
    name = free_register(insn, raw)
    if name is None:
        return Refusal(f"'{insn.mnemonic} {insn.op_str}' leaves no register free")
    reg = REG[name]
    moved = rebase_operand(insn, raw, address, reg)
    if isinstance(moved, Refusal):
        return moved
    save = store_rip(reg, at, saved)
    fetch = load_rip(reg, at + 7, pointer)
    insn_at = 14
    restore = load_rip(reg, at + insn_at + len(moved), saved)
    if save is None or fetch is None or restore is None:
        return Refusal(f"the slot is out of reach of {at:#x}")
    return AliasAccess(save + fetch + moved + restore, name, insn_at, insn_at + len(moved))
