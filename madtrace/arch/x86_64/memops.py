"""Memory operands of one instruction, and their effective addresses.

``memory_accesses(code, address)`` decodes the instruction at ``address``
(capstone, detail on; cache the result by address) into ``MemInstruction``
(``memory_accesses_of(insn)``: the same of an instruction decoded already):
its length and the memory operands it really reads or writes (``lea``,
``nop`` and prefetches have a memory operand but access nothing).  Each
``MemOperand`` knows its size and whether it is loaded, stored or both (a
read-modify-write counts one load and one store, as lackey's "M").
``effective_address(op, regs)`` computes the address from the registers of
the stopped thread (fs/gs bases included; RIP-relative from the
instruction's end).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from capstone import CS_AC_READ, CS_AC_WRITE
from capstone.x86 import X86_OP_MEM, X86_REG_FS, X86_REG_GS, X86_REG_INVALID, X86_REG_RIP

from .decode import capstone_detail

NO_ACCESS_MNEMONICS = ("lea", "nop", "prefetch", "clflush", "clwb", "clflushopt", "endbr64")
# capstone 5 marks these memory operands as read only: they are also (or only) written
READ_WRITE = frozenset({"cmpxchg", "cmpxchg8b", "cmpxchg16b", "rol", "ror", "rcl", "rcr", "sal",
                        "sar", "shl", "shr", "shld", "shrd", "xadd", "xchg", "inc", "dec", "neg",
                        "not", "bts", "btr", "btc"})
WRITE_ONLY = frozenset({"fst", "fstp", "fist", "fistp", "fisttp", "fbstp", "fnstcw", "fstcw",
                        "fnstsw", "fstsw", "stmxcsr", "vstmxcsr", "pextrb", "pextrw", "pextrd",
                        "pextrq", "extractps", "vpextrb", "vpextrw", "vpextrd", "vpextrq",
                        "vextractps", "vextracti128", "vextractf128", "sgdt", "sidt", "sldt",
                        "str", "smsw"})
MASKED_STORES = ("vmaskmov", "vpmaskmov")
STRING_MNEMONICS = ("movs", "stos", "lods", "cmps", "scas", "ins", "outs")

_REG64 = {
    "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11",
    "r12", "r13", "r14", "r15",
}
_REG32 = {"eax": "rax", "ebx": "rbx", "ecx": "rcx", "edx": "rdx", "esi": "rsi", "edi": "rdi",
          "ebp": "rbp", "esp": "rsp", **{f"r{i}d": f"r{i}" for i in range(8, 16)}}


@dataclass(frozen=True, slots=True)
class MemOperand:
    base: str | None        # register name ("rip" for RIP-relative)
    index: str | None
    scale: int
    disp: int
    segment: str | None     # "fs" / "gs" / None
    size: int
    load: bool
    store: bool


class MemInstruction(NamedTuple):
    """Immutable; a named tuple, not a frozen dataclass: one is made per memory
    instruction of every function the hybrid engine copies (~60 000 for python3),
    ~0.5 us each instead of ~4."""
    address: int
    size: int
    mnemonic: str
    text: str
    operands: tuple[MemOperand, ...]
    rep: bool               # a string instruction with a rep prefix: one iteration per step
    atomic: bool = False    # lock-prefixed, or xchg with memory (implicitly locked)

    @property
    def end(self) -> int:
        return self.address + self.size

    def at(self, address: int) -> "MemInstruction":
        """The same instruction at ``address``."""
        return tuple.__new__(MemInstruction, (address,) + self[1:])


def memory_accesses(code: bytes, address: int) -> MemInstruction | None:
    insn = next(capstone_detail().disasm(code, address, 1), None)
    return None if insn is None else memory_accesses_of(insn)


def memory_accesses_of(insn) -> MemInstruction:
    """``memory_accesses`` of an instruction capstone decoded already (detail on)."""
    operands = []
    for op in insn.operands:
        if op.type != X86_OP_MEM:
            operands.append((op.type, 0, 0, None, None, 0, 0, 0))
            continue
        mem = op.mem
        base = insn.reg_name(mem.base) if mem.base != X86_REG_INVALID else None
        if mem.base == X86_REG_RIP:
            base = "rip"
        index = insn.reg_name(mem.index) if mem.index != X86_REG_INVALID else None
        operands.append((X86_OP_MEM, op.access, mem.segment, base, index, mem.scale, mem.disp,
                         op.size))
    return memory_instruction(insn.address, insn.size, insn.mnemonic, insn.op_str, operands)


def memory_instruction(address: int, size: int, mnemonic: str, op_str: str,
                       operands: list) -> MemInstruction:
    """The one reading of an instruction's memory operands: ``operands`` are
    capstone's, each ``(type, access, segment, base name, index name, scale,
    disp, size)`` (only the type of one that is not in memory counts)."""
    found: list[MemOperand] = []
    if not mnemonic.startswith(NO_ACCESS_MNEMONICS):
        # capstone 5 marks some SSE moves' destination (movups [m], xmm) as read: for a
        # plain two-operand move the first operand is written, the second read
        # (string moves, movs[bwdq] [rdi], [rsi], have two memory operands and are left alone)
        plain_move = mnemonic.startswith(("mov", "vmov")) and len(operands) == 2 and \
            sum(op[0] == X86_OP_MEM for op in operands) == 1
        for position, (kind, access, segment, base, index, scale, disp, op_size) in \
                enumerate(operands):
            if kind != X86_OP_MEM:
                continue
            name = mnemonic.split()[-1]
            if plain_move:
                access = CS_AC_WRITE if position == 0 else CS_AC_READ
            elif name in READ_WRITE:
                access = CS_AC_READ | CS_AC_WRITE
            elif name in WRITE_ONLY or (position == 0 and name.startswith(MASKED_STORES)):
                access = CS_AC_WRITE
            found.append(_operand(base, index, scale, disp, _SEGMENTS.get(segment), op_size,
                                  bool(access & CS_AC_READ), bool(access & CS_AC_WRITE)))
    rep = mnemonic.startswith(("rep", "repe", "repne")) and any(
        s in mnemonic for s in STRING_MNEMONICS)
    atomic = mnemonic.startswith("lock") or (mnemonic == "xchg" and bool(found))
    return MemInstruction(address, size, mnemonic, f"{mnemonic} {op_str}", tuple(found), rep,
                          atomic)


_SEGMENTS = {X86_REG_FS: "fs", X86_REG_GS: "gs"}
_OPERANDS: dict[tuple, MemOperand] = {}


def _operand(*fields) -> MemOperand:
    """A MemOperand (immutable: one object for equal operands)."""
    op = _OPERANDS.get(fields)
    if op is None:
        if len(_OPERANDS) > 1 << 16:
            _OPERANDS.clear()
        op = _OPERANDS[fields] = MemOperand(*fields)
    return op


def _reg(regs, name: str) -> int:
    if name in _REG64:
        return getattr(regs, name)
    if name in _REG32:
        return getattr(regs, _REG32[name]) & 0xFFFFFFFF
    raise ValueError(f"unsupported address register {name}")


def effective_address(op: MemOperand, regs, insn: MemInstruction) -> int:
    if op.base == "rip":
        addr = insn.end + op.disp
    else:
        addr = op.disp
        if op.base:
            addr += _reg(regs, op.base)
    if op.index:
        addr += _reg(regs, op.index) * op.scale
    if op.segment == "fs":
        addr += regs.fs_base
    elif op.segment == "gs":
        addr += regs.gs_base
    return addr & 0xFFFFFFFFFFFFFFFF
