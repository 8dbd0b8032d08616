# SPDX-License-Identifier: GPL-2.0-or-later
"""Whole-function relocation with data probes (the hybrid data engine's rewriter).

``copy_function(code, start, end, address, injector, want_probe, new_id, ctl,
bitmap) -> FunctionCopy | Refusal`` re-encodes the function [start, end)
(``code``: its bytes) to run at ``address``:

* relative branches become rel32 branches (``jrcxz``/``loop``: ``jrcxz +2;
  jmp +5; jmp rel32``) to the copy of their target when it lies in the
  function, to the original target otherwise; a RIP-relative operand keeps
  its target (code and data are not moved, only the instructions);
* an instruction ``want_probe`` selects that has one memory operand the
  probe can take (``probe_refusal``) becomes probe_head, ``lea rcx,
  [operand]``, probe (injector/trampolines.S), then the instruction itself
  on ``[rA]``, rA a register it does not use, saved in the probe's frame:
  it records its access into the thread's ring and reaches the data through
  the alias when the page is aliased;
* an indirect jump (a switch table, a computed goto) becomes a stub that
  looks its target up in the copy's table (original offset -> copy offset,
  after the code): a target among the function's instructions is reached in
  the copy, any other as it is;
* a branch that skips an instruction's prefixes (glibc's ``je 1f; lock; 1:
  cmpxchg``) lands on a side copy of the instruction without them, placed
  after the function, which jumps back;
* everything else is copied as it is; a ``jmp end`` closes the copy, in case
  the function's last instruction falls through.

Refused (the function is not relocated): undecodable bytes, any other
branch into the middle of an instruction, ``call`` of the next instruction
(its return address would be the copy's), ``xbegin``, a RIP-relative target
out of reach.

``FunctionCopy``: the copy's bytes, ``old_to_new`` (every original
instruction start -> its copy), ``probes`` (``Probe``: where each part of a
probe is, for the tracer's on-stack replacement and signal fix-ups) and
``unprobed`` (memory instructions left as they are, and why).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from capstone import CS_GRP_BRANCH_RELATIVE, CS_GRP_CALL, CS_GRP_JUMP, CS_GRP_RET
from capstone import x86_const as X

from .decode import capstone_detail
from .copy_encode import HIGH_BYTE, REG, lea, lea_rip, lea_rsp, load, load_rip, load_rsp, movabs, \
    parent64, rebase_operand, rip_displaced, store_rsp
from .memops import MemInstruction, memory_accesses_of
from .redirect import redirectable
from .relocate import Refusal, _relocate_branch, encode_jmp

# registers a probe may hold the address in (not rax/rcx/rdx: the probe's own;
# not rsp/rbp/r12/r13: [reg] would need a SIB byte or a displacement)
ADDRESS_REGS = ("rsi", "rdi", "rbx", "r8", "r9", "r10", "r11", "r14", "r15")
LOW_ADDRESS_REGS = ("rsi", "rdi", "rbx")
LOOPS = {X.X86_INS_JRCXZ, X.X86_INS_JECXZ, X.X86_INS_LOOP, X.X86_INS_LOOPE, X.X86_INS_LOOPNE}
REFUSED = {X.X86_INS_XBEGIN: "xbegin", X.X86_INS_XABORT: "xabort"}


@dataclass
class Probe:
    original: int       # the instruction, in the original code
    start: int          # the probe, in the copy
    body: int           # where template "probe" begins (after the address computation)
    insn: int           # the instruction on [reg]
    insn_end: int
    end: int            # the next instruction of the copy
    reg: str            # rA
    ident: int          # instruction id (its data records)


@dataclass
class Stub:
    """An indirect jump's translation stub (see ``_stub``)."""
    original: int       # the jump, in the original code
    start: int
    load: int           # the instruction that loads the target (may fault)
    end: int


@dataclass
class FunctionCopy:
    start: int
    end: int
    address: int
    code: bytes
    old_to_new: dict[int, int]
    probes: list[Probe] = field(default_factory=list)
    unprobed: dict[int, str] = field(default_factory=dict)
    targets: frozenset = frozenset()     # the function's own direct branch targets
    stubs: list[Stub] = field(default_factory=list)
    code_size: int = 0                   # the code, before the jump table
    returns: dict = field(default_factory=dict)   # return address in the copy -> original

    def stub_at(self, address: int) -> Stub | None:
        for stub in self.stubs:
            if stub.start <= address < stub.end:
                return stub
        return None

    @property
    def copy_end(self) -> int:
        return self.address + len(self.code)

    def probe_at(self, address: int) -> Probe | None:
        """The probe whose code holds ``address`` (an address in the copy)."""
        i = bisect.bisect_right([p.start for p in self.probes], address) - 1
        if i >= 0 and address < self.probes[i].end:
            return self.probes[i]
        return None

    def original_of(self, address: int) -> int | None:
        """The original instruction whose copy holds ``address``."""
        pairs = sorted((new, old) for old, new in self.old_to_new.items())
        i = bisect.bisect_right([n for n, _ in pairs], address) - 1
        return pairs[i][1] if i >= 0 else None


def probe_refusal(mem: MemInstruction | None, insn) -> str | None:
    """Why the instruction cannot take a probe (None: it can)."""
    why = redirectable(mem)
    if why is not None:
        return why
    op = mem.operands[0]
    if op.segment is not None:
        return "segment override"
    if op.base in ("rsp", "esp") or op.index in ("rsp", "esp"):
        return "stack-relative operand"
    if (op.base and parent64(op.base) is None and op.base != "rip") or \
            (op.index and parent64(op.index) is None):
        return "unusual address register"
    if (op.base and op.base != "rip" and parent64(op.base) != op.base) or \
            (op.index and parent64(op.index) != op.index):
        return "32-bit address"
    if "rsp" in _registers(insn):
        return "uses the stack pointer"
    return None


def _registers(insn) -> set[str]:
    try:
        read, written = insn.regs_access()
    except Exception:   # capstone cannot tell: assume the worst
        return set(REG)
    names = {insn.reg_name(r) for r in (*read, *written)}
    return {parent64(n) for n in names if parent64(n)} | {n for n in names if n in HIGH_BYTE}


def _address_reg(insn, raw: bytes) -> str | None:
    used = _registers(insn)
    choices = ADDRESS_REGS
    if used & HIGH_BYTE or raw[:1] == b"\xc5" or any(b == 0xC5 for b in raw[:4]):
        choices = LOW_ADDRESS_REGS        # no REX (ah..dh), or a 2-byte VEX: no B bit
    for reg in choices:
        if reg not in used:
            return reg
    return None


def copy_function(code: bytes, start: int, end: int, address: int, injector, want_probe,
                  new_id, ctl: int, bitmap: int) -> FunctionCopy | Refusal:
    insns = []
    pos = 0
    size = end - start
    for insn in capstone_detail().disasm(bytes(code[:size]), start):   # one sweep, stops at bad bytes
        insns.append(insn)
        pos += insn.size
    if pos != size:
        return Refusal(f"undecodable instruction at {start + pos:#x}")
    starts = {i.address for i in insns}
    by_address = {i.address: i for i in insns}
    sides = {}          # branch target past an instruction's prefixes -> that instruction
    head = injector.templates["probe_head"]
    probe = injector.templates["probe"]
    plans = []            # (insn, kind, size, extra)
    unprobed: dict[int, str] = {}
    targets = set()
    for insn in insns:
        raw = bytes(code[insn.address - start:insn.address - start + insn.size])
        groups = set(insn.groups)
        if insn.id in REFUSED:
            return Refusal(f"'{insn.mnemonic}' at {insn.address:#x}")
        if CS_GRP_BRANCH_RELATIVE in groups:
            target = insn.operands[0].imm
            if start < target < end and target not in starts:
                host = _prefixed_host(by_address, code, start, target)
                if host is None:
                    return Refusal(f"branch at {insn.address:#x} into the middle of an instruction")
                sides[target] = host
            if start <= target < end:
                targets.add(target)
            if CS_GRP_CALL in groups and target == insn.address + insn.size:
                return Refusal(f"call of the next instruction at {insn.address:#x}")
            plans.append((insn, "branch", 9 if insn.id in LOOPS else _branch_size(insn, raw), raw))
            continue
        if CS_GRP_JUMP in groups and CS_GRP_RET not in groups:
            why = _stub_refusal(insn)
            if why:
                return Refusal(f"indirect jump '{insn.mnemonic} {insn.op_str}' at "
                               f"{insn.address:#x}: {why}")
            plans.append((insn, "stub", STUB_SIZE + _target_load_size(insn), raw))
            continue
        mem = memory_accesses_of(insn)
        if mem is not None and mem.operands and want_probe(mem):
            why = probe_refusal(mem, insn)
            reg = _address_reg(insn, raw) if why is None else None
            if why is None and reg is None:
                why = "no free register"
            rebased = rebase_operand(raw, insn.address, REG[reg]) if why is None else None
            if why is None and not isinstance(rebased, bytes):
                why = str(rebased)
            if why is None:
                op = mem.operands[0]
                ea = 7 if op.base == "rip" else len(_lea(op))
                suffix = 5 + 5 + len(rebased) + 5 + 8
                plans.append((insn, "probe", head.size + ea + probe.size + suffix,
                              (mem, reg, rebased)))
                continue
            unprobed[insn.address] = why
        elif mem is not None and mem.operands:
            unprobed[insn.address] = "not selected"
        if any(op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RIP for op in insn.operands):
            plans.append((insn, "rip", insn.size, raw))
        else:
            plans.append((insn, "copy", insn.size, raw))
    # layout: the function, its closing jump, the side entries, the jump table
    old_to_new = {}
    at = address
    for insn, _kind, psize, _extra in plans:
        old_to_new[insn.address] = at
        at += psize
    at += 5
    side_at = {}
    for target, host in sorted(sides.items()):
        side_at[target] = at
        old_to_new[target] = at
        at += host.size - (target - host.address) + 5
    code_size = at - address
    table_at = (at + 7) & ~7 if any(kind == "stub" for _i, kind, _s, _e in plans) else 0
    out = bytearray()
    probes = []
    stubs: list[Stub] = []
    for insn, kind, psize, extra in plans:
        here = address + len(out)
        if kind == "branch":
            piece = _branch(insn, extra, here, old_to_new, start, end)
            if isinstance(piece, str):
                return Refusal(piece)
        elif kind == "rip":
            piece = rip_displaced(insn, extra, here)
            if isinstance(piece, str):
                return Refusal(f"'{insn.mnemonic} {insn.op_str}' at {insn.address:#x}: {piece}")
        elif kind == "stub":
            piece, entry = _stub(insn, extra, here, start, end, address, table_at)
            if isinstance(piece, str):
                return Refusal(piece)
            stubs.append(entry)
        elif kind == "probe":
            mem, reg, rebased = extra
            piece, entry = _probe(insn, mem, reg, rebased, here, head, probe, injector,
                                  new_id(mem), ctl, bitmap)
            if isinstance(piece, str):
                return Refusal(piece)
            probes.append(entry)
        else:
            piece = extra
        if len(piece) != psize:
            return Refusal(f"internal: {kind} at {insn.address:#x} is {len(piece)} bytes, "
                           f"planned {psize}")
        out += piece
    tail = encode_jmp(address + len(out), end)
    if tail is None:
        return Refusal(f"the end of the function {end:#x} is out of reach")
    out += tail
    for target, host in sorted(sides.items()):
        piece = _side(host, code, start, target, address + len(out), old_to_new)
        if isinstance(piece, str):
            return Refusal(piece)
        out += piece
    if len(out) != code_size:
        return Refusal(f"internal: the copy is {len(out)} bytes, planned {code_size}")
    if table_at:
        out += bytes(table_at - address - len(out)) + _jump_table(old_to_new, start, end, address)
    returns = {old_to_new[i.address] + psize: i.address + i.size
               for i, _kind, psize, _extra in plans if CS_GRP_CALL in set(i.groups)}
    return FunctionCopy(start, end, address, bytes(out), old_to_new, probes, unprobed,
                        frozenset(targets), stubs, code_size, returns)


def _branch_size(insn, raw: bytes) -> int:
    piece = _relocate_branch(insn, raw, insn.operands[0].imm)   # as if next to its target
    return len(piece) if isinstance(piece, bytes) else 0       # 0: refused when emitted


def _branch(insn, raw: bytes, at: int, old_to_new: dict[int, int], start: int, end: int):
    target = insn.operands[0].imm
    if start <= target < end:
        target = old_to_new[target]
    moved = _Retarget(insn, target)
    piece = _relocate_branch(moved, raw, at)
    if piece is None:
        return f"branch at {insn.address:#x}: target out of reach"
    if isinstance(piece, str):
        return f"branch at {insn.address:#x}: {piece}"
    return piece


class _Retarget:
    """A capstone instruction seen with another branch target."""

    def __init__(self, insn, target: int):
        self._insn = insn
        self.operands = [_Imm(target)]

    def __getattr__(self, name):
        return getattr(self._insn, name)


class _Imm:
    def __init__(self, imm: int):
        self.imm = imm


def _lea(op) -> bytes:
    return lea(REG["rcx"], REG[op.base] if op.base else None, REG[op.index] if op.index else None,
               op.scale or 1, op.disp)


def _probe(insn, mem: MemInstruction, reg: str, rebased: bytes, at: int, head, probe, L,
           ident: int, ctl: int, bitmap: int):
    op = mem.operands[0]
    out = bytearray(head.code)
    if op.base == "rip":
        ea = lea_rip(REG["rcx"], at + len(out), mem.end + op.disp)
        if ea is None:
            return f"operand of {insn.address:#x} out of reach", None
    else:
        ea = _lea(op)
    out += ea
    body = at + len(out)
    out += probe.instantiate(body, bitmap=bitmap, ctl=ctl,
                             code=(L.MT_DATA_CODE | ident) - (1 << 32))
    r = REG[reg]
    out += store_rsp(L.MT_PF_SAVED, r) + load_rsp(r, L.MT_PF_ADDR)
    start_insn = at + len(out)
    out += rebased
    end_insn = at + len(out)
    out += load_rsp(r, L.MT_PF_SAVED) + lea_rsp(L.MT_PROBE_FRAME)
    return bytes(out), Probe(insn.address, at, body, start_insn, end_insn, at + len(out), reg, ident)


# ------------------------------------------------------------ side entries
def _prefixed_host(by_address: dict, code: bytes, start: int, target: int):
    """The instruction ``target`` lies in when only legacy prefixes precede it
    there (a branch that skips a ``lock``), else None."""
    from .redirect import LEGACY_PREFIXES
    for back in range(1, 15):
        host = by_address.get(target - back)
        if host is not None:
            raw = code[host.address - start:target - start]
            if target < host.address + host.size and all(b in LEGACY_PREFIXES for b in raw):
                return host
            return None
    return None


def _side(host, code: bytes, start: int, target: int, at: int, old_to_new: dict):
    """The instruction without the prefixes the branch skips, then a jump back
    to the copy of the next instruction."""
    raw = bytes(code[target - start:host.address + host.size - start])
    insn = next(capstone_detail().disasm(raw, target, 1), None)
    if insn is None or insn.size != len(raw):
        return f"side entry at {target:#x}: undecodable"
    if any(op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RIP for op in insn.operands):
        raw = rip_displaced(insn, raw, at)
        if isinstance(raw, str):
            return f"side entry at {target:#x}: {raw}"
    back = encode_jmp(at + len(raw), old_to_new[host.address + host.size])
    if back is None:
        return f"side entry at {target:#x}: out of reach"
    return raw + back


# ------------------------------------------------------------ indirect jumps
FRAME = 128 + 24          # the red zone, then rax, rcx, the target
STUB_SIZE = 8 + 4 + 5 + 5 + 1 + 10 + 3 + 6 + 2 + 10 + 4 + 4 + 2 + 10 + 3 + 5 + 1 + 5 + 4 + 8 + 7


def _stub_refusal(insn) -> str | None:
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


def _target_load_size(insn) -> int:
    op = insn.operands[0]
    if op.type == X.X86_OP_REG:
        return 3
    if op.mem.base == X.X86_REG_RIP:
        return 7
    return len(_target_load(insn, 0))


def _target_load(insn, at: int) -> bytes:
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


def _stub(insn, raw: bytes, at: int, start: int, end: int, base: int, table: int):
    """The jump's target, translated: a target inside the function that its
    table maps goes to the copy, any other stays.  Every register and flag is
    as before when it jumps."""
    import struct
    out = bytearray(lea_rsp(-FRAME) + store_rsp(0, REG["rax"]) + store_rsp(8, REG["rcx"]))
    load_at = at + len(out)
    target_load = _target_load(insn, load_at)
    if target_load is None:
        return f"indirect jump at {insn.address:#x}: its operand is out of reach", None
    out += target_load
    out += store_rsp(16, REG["rax"]) + b"\x9c"                        # pushfq
    out += movabs(REG["rcx"], -start) + b"\x48\x01\xc8"               # add rax, rcx
    out += b"\x48\x3d" + struct.pack("<i", end - start) + b"\x73"     # cmp rax, size; jae
    skip = len(out)
    out += b"\x00"
    out += movabs(REG["rcx"], table) + b"\x48\x63\x04\x81"            # movsxd rax, [rcx+rax*4]
    out += b"\x48\x83\xf8\xff\x74"                                    # cmp rax, -1; je
    skip2 = len(out)
    out += b"\x00"
    out += movabs(REG["rcx"], base) + b"\x48\x01\xc8" + store_rsp(24, REG["rax"])
    out[skip] = len(out) - skip - 1
    out[skip2] = len(out) - skip2 - 1
    out += b"\x9d" + load_rsp(REG["rcx"], 8) + load_rsp(REG["rax"], 0) + lea_rsp(FRAME)
    out += b"\xff\xa4\x24" + struct.pack("<i", 16 - FRAME)            # jmp [rsp - FRAME + 16]
    return bytes(out), Stub(insn.address, at, load_at, at + len(out))


def _jump_table(old_to_new: dict, start: int, end: int, base: int) -> bytes:
    import numpy as np
    table = np.full(end - start, -1, dtype=np.int32)
    for old, new in old_to_new.items():
        if start <= old < end:
            table[old - start] = new - base
    return table.tobytes()
