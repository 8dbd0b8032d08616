# SPDX-License-Identifier: GPL-2.0-or-later
"""Probes of string instructions in a function copy (function_copy.py).

A string instruction reaches memory through rsi and rdi, which it moves on
by the operand's size (back, with the direction flag set); with a rep prefix
it repeats rcx times (repe/repne: while ZF says so).  Its probe runs one
iteration on the alias addresses, then sets the registers back by what the
iteration moved them:

* ``stos``, ``lods``, ``scas`` (one operand, [rdi] or [rsi]): the data probe
  (injector/trampolines.S ``probe``) on that register, rA being the register
  itself;
* ``movs`` (a load of [rsi], then a store to [rdi]) and ``cmps`` (loads of
  [rdi], then [rsi], the order valgrind's lackey reports): ``string_probe``,
  which records both (``first``, then ``second``; ``alone`` when only the
  second's page is traced) and publishes them at once.  The tracer stores
  the two addresses in the probe's frame in that order before it.

Then the instruction without its rep prefix, then ``pushfq; sub rA, [alias];
add rA, [saved]; popfq`` (the flags as the instruction left them), the
result kept in the frame's saved slot that the probe's tail reloads.  A rep
prefix becomes a loop around the probe, without touching the flags::

        jmp check
    body:   the probe, the instruction, its fix-up
        lea rcx, [rcx - 1]
        jne/je done                 (repe / repne)
    check:  jrcxz done
        jmp body
    done:

A thread at the loop's first byte is where the original instruction would be
with rcx iterations left: that byte is the instruction's place in the copy.
Settling a thread (data/hybrid/probe_settle.py) uses the ``Probe`` fields:
``head`` (the probe proper starts), ``insn``, ``insn_end`` (after the
fix-up), ``end`` (after the probe's tail), ``last`` (after the loop).

Refused (the fault path carries them): an address-size or segment prefix,
``ins``/``outs``.
"""

from __future__ import annotations

import struct

from .copy_encode import REG, lea, lea_rsp, load_rsp, store_rsp
from .memops import MemInstruction

ONE, PAIR = 1, 2                 # ProbePlan.string: the probe's kind
REP, REPE, REPNE = 1, 2, 3       # ProbePlan.loop
# the register of each kind's operand (of its first access), and the probe
KINDS = {"movs": ("rsi", PAIR), "cmps": ("rdi", PAIR), "stos": ("rdi", ONE), "lods": ("rsi", ONE),
         "scas": ("rdi", ONE)}
OTHER = {"rsi": "rdi", "rdi": "rsi"}
CONDITIONAL = ("scas", "cmps")          # rep is repe, and repne is allowed
_PREFIXES_KEPT = frozenset(range(0x40, 0x50)) | {0x66}
PUSHFQ, POPFQ = b"\x9c", b"\x9d"
DEC_RCX = b"\x48\x8d\x49\xff"    # lea rcx, [rcx - 1]: the flags as they are
LOOP_TAIL = 4 + 2 + 7            # DEC_RCX, jne/je rel8 (repe/repne), jrcxz +5, jmp rel32


def string_kind(mem: MemInstruction) -> str | None:
    """``movs``, ``stos``... of a string instruction this module can probe."""
    name = mem.mnemonic.split()[-1]
    if name[:-1] in KINDS and name[-1:] in ("b", "w", "d", "q") and "xmm" not in mem.text:
        return name[:-1]
    return None


def plan_fields(raw: bytes, mem: MemInstruction) -> tuple[str | None, str, bytes, bytes, int, int]:
    """(why not, rA, lead, the instruction without rep, kind of probe, loop) of
    a string instruction (``string_kind``)."""
    kind = string_kind(mem)
    if kind is None:
        return "string instruction", "", b"", b"", 0, 0
    reg, probe = KINDS[kind]
    loop = 0
    body = bytearray()
    for k, byte in enumerate(raw):
        if byte in (0xF3, 0xF2):
            if loop:
                return "string instruction with two rep prefixes", "", b"", b"", 0, 0
            loop = (REPNE if byte == 0xF2 else REPE) if kind in CONDITIONAL else REP
            if byte == 0xF2 and kind not in CONDITIONAL:
                return f"'repne {kind}'", "", b"", b"", 0, 0
        elif byte in _PREFIXES_KEPT:
            body.append(byte)
        elif k == len(raw) - 1:
            body.append(byte)
        else:
            return f"string instruction with prefix {byte:#04x}", "", b"", b"", 0, 0
    if any(op.segment or op.base not in ("rsi", "rdi") or op.index for op in mem.operands):
        return "string instruction on an unusual operand", "", b"", b"", 0, 0
    lead = lea(REG["rcx"], REG[reg], None, 1, 0) if probe == ONE else b""
    return None, reg, lead, bytes(body), probe, loop


def pair_operands(mem: MemInstruction, first: str):
    """The operands of a ``movs`` or ``cmps``: (the one on register ``first``,
    the other)."""
    by_base = {op.base: op for op in mem.operands}
    return by_base[first], by_base[OTHER[first]]


def _alu_rsp(opcode: int, reg: int, disp: int) -> bytes:
    """``sub/add reg, qword ptr [rsp + disp8]`` (rsi or rdi)."""
    return bytes([0x48, opcode, 0x44 | (reg & 7) << 3, 0x24, disp])


class StringProbes:
    """The string probes of one injector, control area and alias bitmap."""

    def __init__(self, injector, ctl: int, bitmap: int, head: bytes):
        L = self.L = injector
        self.head, self.ctl, self.bitmap = head, ctl, bitmap
        self.one, self.pair = L.templates["probe"], L.templates["string_probe"]
        self.code = L.MT_DATA_CODE

    def _code(self, ident: int) -> int:
        return (self.code | ident) - (1 << 32)

    def _parts(self, plan) -> tuple[bytes, bytes, bytes]:
        """(save, fix-up, restore) of ``plan``'s probe."""
        L, reg = self.L, REG[plan.reg]
        save = store_rsp(L.MT_PF_SAVED, reg) + load_rsp(reg, L.MT_PF_ADDR)
        fix = PUSHFQ + _alu_rsp(0x2B, reg, 8 + L.MT_PF_ADDR) + _alu_rsp(0x03, reg, 8 + L.MT_PF_SAVED)
        if plan.string == PAIR:
            other = REG[OTHER[plan.reg]]
            save += store_rsp(L.MT_PF_SAVED2, other) + load_rsp(other, L.MT_PF_ADDR2)
            fix += _alu_rsp(0x2B, other, 8 + L.MT_PF_ADDR2) + \
                _alu_rsp(0x03, other, 8 + L.MT_PF_SAVED2)
        fix += POPFQ + store_rsp(L.MT_PF_SAVED, reg)
        restore = load_rsp(reg, L.MT_PF_SAVED) + lea_rsp(L.MT_PROBE_FRAME)
        return save, fix, restore

    def _lead(self, plan) -> bytes:
        """The address computation: ``lea rcx, [rA]`` (one operand), or both
        addresses into the frame, in the order of their accesses."""
        if plan.string != PAIR:
            return plan.lead
        L = self.L
        return store_rsp(L.MT_PF_ADDR, REG[plan.reg]) + store_rsp(L.MT_PF_ADDR2, REG[OTHER[plan.reg]])

    def size(self, plan) -> int:
        save, fix, restore = self._parts(plan)
        template = self.pair if plan.string == PAIR else self.one
        loop = 5 + LOOP_TAIL - (0 if plan.loop in (REPE, REPNE) else 2) if plan.loop else 0
        return loop + len(self.head) + len(self._lead(plan)) + template.size + len(save) + \
            len(plan.rebased) + len(fix) + len(restore)

    def probe(self, pieces: list, plan, original: int, at: int, ident) -> tuple:
        """The probe's bytes appended to ``pieces``; its row (``Probe``'s fields).
        ``ident``: the instruction id (``movs``, ``cmps``: the ids of its first
        access, of its second after the first and of its second alone)."""
        save, fix, restore = self._parts(plan)
        lead = self._lead(plan)
        loop_head = 5 if plan.loop else 0
        head = at + loop_head
        body = head + len(self.head) + len(lead)
        if plan.string == PAIR:
            first, second, alone = ident
            made = self.pair.instantiate(body, bitmap=self.bitmap, ctl=self.ctl,
                                         first=self._code(first), second=self._code(second),
                                         alone=self._code(alone))
            ident = first
        else:
            made = self.one.instantiate(body, bitmap=self.bitmap, ctl=self.ctl, code=self._code(ident))
        insn = body + len(made) + len(save)
        insn_end = insn + len(plan.rebased) + len(fix)
        end = insn_end + len(restore)
        out = [self.head, lead, bytes(made), save, plan.rebased, fix, restore]
        if plan.loop:
            tail = DEC_RCX
            if plan.loop in (REPE, REPNE):
                tail += bytes([0x75 if plan.loop == REPE else 0x74, 7])
            check = end + len(tail)
            tail += b"\xe3\x05\xe9" + struct.pack("<i", head - (check + 7))
            out.insert(0, b"\xe9" + struct.pack("<i", check - (at + 5)))
            out.append(tail)
            last = check + 7
        else:
            last = end
        pieces += out
        return (original, at, body, insn, insn_end, end, plan.reg, ident, plan.string, plan.loop,
                head, last)
