# SPDX-License-Identifier: GPL-2.0-or-later
"""Re-encoding an instruction with its memory operand redirected.

``redirect_operand(code, address, new_address, target) -> bytes | Refusal``
re-encodes the instruction at ``address`` (``code`` holds its bytes) for
execution at ``new_address`` with its one ModRM memory operand replaced by
``[rip + disp32]`` pointing at ``target`` (the data engine's per-thread
slot).  Every other operand, the opcode, the operand size and any immediate
are kept; segment overrides (fs/gs) and the address-size prefix are dropped,
since the slot is a plain address; REX.X/REX.B and VEX's and EVEX's X/B
(which only extend the dropped base and index registers) are cleared; an
EVEX compressed disp8 becomes a plain disp32.  The result is
decoded again and compared with the original before it is returned.

``redirectable(insn) -> str | None``: why a decoded ``MemInstruction``
cannot take this path (None: it can).
``emulation(insn) -> str | None``: "jmp", "call", "movs" or "stos" when the
tracer carries the instruction out itself instead (a branch through memory
whose return address or target would otherwise be the stub's; a string
instruction, one iteration per element, in chunks).  Instructions that can
take neither path take the data engine's slow path (single-step with the
pages open).
"""

from __future__ import annotations

from capstone import x86_const as X

from .copy_encode import operand_parts, same_operation
from .decode import decode_one
from .memops import MemInstruction
from .relocate import Refusal

# control transfers (the return address or target would be the stub's), stack pops
# whose address depends on the popped rsp, bit strings addressed beyond the operand by a
# register, and state saves whose size is not the operand's
UNSUITABLE = ("call", "jmp", "ret", "loop", "pop", "enter", "leave", "xsave", "xrstor",
              "fxsave", "fxrstor", "fnsave", "frstor", "fnstenv", "fldenv", "fsave", "fstenv",
              "vgather", "vpgather", "vscatter", "vpscatter", "maskmov", "bnd", "clflush",
              "movdir64b", "enqcmd")
BIT_STRING = ("bt", "bts", "btr", "btc")
MAX_OPERAND = 64


def redirectable(insn: MemInstruction | None) -> str | None:
    if insn is None:
        return "undecodable"
    if len(insn.operands) != 1:
        return "not exactly one memory operand" if insn.operands else "no memory operand"
    if insn.rep or is_string(insn):
        return "string instruction"
    if insn.mnemonic.startswith(UNSUITABLE) or insn.mnemonic.startswith("j"):
        return f"'{insn.mnemonic}' is not redirected"
    if insn.mnemonic in BIT_STRING and insn.text.split(",")[-1].strip()[:1] not in "0123456789-":
        return "bit string with a register offset"
    op = insn.operands[0]
    if not 1 <= op.size <= MAX_OPERAND:
        return f"operand of {op.size} bytes"
    if op.index and op.index[0] in "xyz":
        return "vector index"
    return None


STRING_NAMES = frozenset(f"{op}{w}" for op in ("movs", "stos", "lods", "cmps", "scas", "ins", "outs")
                         for w in "bwdq")


def is_string(insn: MemInstruction) -> bool:
    """A string instruction (movsd/cmpsd are also SSE instructions, on xmm registers)."""
    return insn.mnemonic.split()[-1] in STRING_NAMES and "xmm" not in insn.text


def emulation(insn: MemInstruction | None) -> str | None:
    if insn is None or any(op.segment for op in insn.operands):
        return None
    if any(r and r in _REG32 for op in insn.operands for r in (op.base, op.index)):
        return None
    words = insn.mnemonic.split()
    name = words[-1]
    if words[0] in ("bnd", "notrack") and len(words) == 2 or len(words) == 1:
        if name in ("jmp", "call") and len(insn.operands) == 1 and insn.operands[0].size == 8:
            return name
    if len(words) == 1 or words[0] in ("rep", "repne"):
        if name in ("movsb", "movsw", "movsd", "movsq") and len(insn.operands) == 2:
            return "movs"
        if name in ("stosb", "stosw", "stosd", "stosq") and len(insn.operands) == 1:
            return "stos"
    return None


_REG32 = frozenset({"eax", "ebx", "ecx", "edx", "esi", "edi", "ebp", "esp",
                    *(f"r{i}d" for i in range(8, 16))})


def redirect_operand(code: bytes, address: int, new_address: int, target: int) -> bytes | Refusal:
    insn = decode_one(code, address)
    if insn is None:
        return Refusal(f"undecodable instruction at {address:#x}")
    raw = bytes(code[:insn.size])
    parts = operand_parts(raw, insn.modrm_offset, f"{insn.mnemonic} {insn.op_str}", 0, "redirected")
    if isinstance(parts, Refusal):
        return parts
    prefixes, head, immediate = parts
    modrm = (raw[insn.modrm_offset] & 0x38) | 0x05     # mod 00, rm 101: [rip + disp32]
    length = len(prefixes) + len(head) + 1 + 4 + len(immediate)
    if length > 15:
        return Refusal("re-encoded instruction would exceed 15 bytes")
    disp = target - (new_address + length)
    if not -(1 << 31) <= disp < (1 << 31):
        return Refusal(f"slot {target:#x} out of disp32 range of {new_address:#x}")
    out = prefixes + head + bytes([modrm]) + disp.to_bytes(4, "little", signed=True) + immediate
    problem = _check(insn, decode_one(out, new_address), target)
    if problem:
        return Refusal(f"'{insn.mnemonic} {insn.op_str}' at {address:#x}: {problem}")
    return out


def _check(old, new, target: int) -> str | None:
    """The re-encoded instruction must be the same operation on the slot."""
    def on_slot(insn, op) -> bool:
        return op.mem.base == X.X86_REG_RIP and op.mem.index == X.X86_REG_INVALID and \
            insn.address + insn.size + op.mem.disp == target

    return same_operation(old, new, on_slot, "memory operand not redirected")
