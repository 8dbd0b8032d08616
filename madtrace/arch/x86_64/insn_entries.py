# SPDX-License-Identifier: GPL-2.0-or-later
"""What a function copy needs to know of one instruction, by its bytes.

Most of an instruction's treatment in a function copy depends on its bytes
only, not on its address: what it is (a relative branch, an indirect jump, a
memory access...), its branch's re-encoding, its memory operands, whether
and how it can take a probe.  A program repeats its instructions (the
functions CPython's run copies hold 224k instructions, 68k distinct), so
``entries(raws)`` keeps an ``Entry`` per distinct byte string for the life
of the process: an instruction seen before costs a dictionary look-up;
those not seen yet are decoded in one ``cs_disasm`` call (detail.py) and
analysed from capstone's columns.

An ``Entry`` (address-independent; an address below is the instruction's):

* ``kind``: ``COPY``, ``RIP`` (a RIP-relative operand), ``BRANCH`` (relative),
  ``STUB`` (indirect jump), ``REFUSE`` (``xbegin``/``xabort``); ``call``;
  ``planned``: the size of its piece in a copy when it takes no probe;
* a branch: ``rel`` (target - address), ``head`` (its re-encoding up to the
  rel32) or ``head_why``; ``size_why`` (its planned size is not its size);
* an indirect jump: ``view`` (for its stub), ``stub_why``, ``error``;
* a RIP-relative operand: ``rip_field`` (offset of its disp32), ``rip_disp``
  or ``rip_why``; ``text``;
* memory operands: ``mem`` (``MemInstruction`` at address 0: see
  ``MemInstruction`` ``at``), ``plan`` (``ProbePlan``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from capstone import CS_GRP_BRANCH_RELATIVE, CS_GRP_CALL, CS_GRP_JUMP, CS_GRP_RET
from capstone import x86_const as X

from .copy_encode import HIGH_BYTE, REG, lea, load, parent64, rebase_problem, rebased, rip_field
from .detail import REG_NAMES, Decoded, InsnView, decode
from .jump_stubs import STUB_SIZE, stub_refusal, target_load_size
from .memops import MemInstruction, memory_instruction
from .redirect import is_string, redirectable
from .string_probes import plan_fields as string_plan
from .relocate import _LOOPS as BRANCH_LOOPS
from .relocate import branch_head

COPY, RIP, BRANCH, STUB, REFUSE = 0, 1, 2, 3, 5
# registers a probe may hold the address in (not rax/rcx/rdx: the probe's own;
# not rsp/rbp/r12/r13: [reg] would need a SIB byte or a displacement)
ADDRESS_REGS = ("rsi", "rdi", "rbx", "r8", "r9", "r10", "r11", "r14", "r15")
LOW_ADDRESS_REGS = ("rsi", "rdi", "rbx")
LOOPS = {X.X86_INS_JRCXZ, X.X86_INS_JECXZ, X.X86_INS_LOOP, X.X86_INS_LOOPE, X.X86_INS_LOOPNE}
REFUSED = {X.X86_INS_XBEGIN: "xbegin", X.X86_INS_XABORT: "xabort"}
REG_ID = {name: i for i, name in enumerate(REG_NAMES) if name}
MAX_ENTRIES = 1 << 20


@dataclass
class ProbePlan:
    why: str | None                 # None: the instruction can take a probe
    reg: str = ""                   # rA
    lead: bytes = b""               # lea rcx, [operand] (RIP-relative: its disp32 at 3, 0)
    rip: bool = False               # the operand is RIP-relative ...
    disp: int = 0                   # ... at this displacement from the instruction's end
    rebased: bytes = b""            # the instruction on [rA]
    check: str | None = None        # why its re-encoding is not the instruction (see ``why_at``)
    after: bytes = b""              # after the probe's frame is gone: a call through memory's call
    string: int = 0                 # a string instruction's probe (string_probes.py ONE, PAIR) ...
    loop: int = 0                   # ... and its rep prefix's loop (REP, REPE, REPNE)
    stack: int = 0                  # the instruction's own move of rsp (a push: -8; ``_push_plan``)
    # the probe's pieces for one set of probe templates (function_copy.py's _ProbeParts)
    made_for: object = field(default=None, compare=False, repr=False)
    pieces: tuple = field(default=(), compare=False, repr=False)

    @property
    def extra(self) -> int:
        """The bytes of the probe that are the instruction's own."""
        return len(self.lead) + len(self.rebased) + len(self.after)

    def why_at(self, text: str, address: int) -> str | None:
        if self.check is not None:
            return f"'{text}' at {address:#x}: {self.check}"
        return self.why


HEAD_WHY, SIZE_WHY, RIP_WHY, MEM, ERROR = 1, 2, 4, 8, 16     # Entry.row's flags
R11 = 32            # (a flag too) the instruction reads or writes r11 (or a part of it)
R11_IDS = (X.X86_REG_R11, X.X86_REG_R11D, X.X86_REG_R11W, X.X86_REG_R11B)
_R11_TABLE = np.zeros(X.X86_REG_ENDING + 1, dtype=bool)     # by capstone register id
_R11_TABLE[list(R11_IDS)] = True


class Entry:
    __slots__ = ("size", "kind", "call", "mnemonic", "text", "planned", "rel", "head", "head_why",
                 "size_why", "view", "stub_why", "error", "rip_field", "rip_disp", "rip_why",
                 "mem", "plan", "piece", "row", "r11")

    def __init__(self, size: int, kind: int, call: bool, mnemonic: str, text: str):
        self.size, self.kind, self.call, self.mnemonic, self.text = size, kind, call, mnemonic, text
        self.planned = size
        self.rel = 0
        self.head: bytes = b""
        self.head_why: str | None = None
        self.size_why: str | None = None
        self.stub_why: str | None = None
        self.rip_why: str | None = None
        self.view: InsnView | None = None
        self.error: ValueError | None = None
        self.mem: MemInstruction | None = None
        self.plan: ProbePlan | None = None
        self.rip_field = self.rip_disp = 0
        self.piece = b""
        self.row: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)
        self.r11 = False

    def finish(self) -> "Entry":
        """``row``: (kind, planned, call, field, flags, value), what a function's
        analysis reads of every instruction, in one numpy array: ``field`` is the
        offset of a branch's rel32 or of a RIP-relative disp32 in the piece,
        ``value`` the branch's target or the RIP-relative operand's address from
        the instruction's address (less its size)."""
        flags = (HEAD_WHY if self.head_why is not None else 0) | \
            (SIZE_WHY if self.size_why is not None else 0) | \
            (RIP_WHY if self.rip_why is not None else 0) | \
            (MEM if self.mem is not None else 0) | (ERROR if self.error is not None else 0) | \
            (R11 if self.r11 else 0)
        if self.kind == BRANCH:
            field, value = len(self.head), self.rel
            self.piece = (self.head + bytes(4))[:self.planned].ljust(self.planned, b"\0")
        else:
            field, value = self.rip_field, self.rip_disp
        self.row = (self.kind, self.planned, int(self.call), field, flags, value)
        return self


analysed: dict[bytes, Entry] = {}
# entries kept from earlier runs (data/hybrid/entry_cache.py), as stored: made into an
# Entry by ``_restore`` when an instruction first needs one
kept_entries: dict[bytes, Any] = {}
_restore: Callable[[Any], Entry] | None = None


def store(entries_of_earlier_runs: dict[bytes, Any], restore: Callable[[Any], Entry]) -> None:
    """Entries of earlier runs, made by ``restore`` when needed instead of analysed."""
    global _restore
    kept_entries.update(entries_of_earlier_runs)
    _restore = restore


def entries(raws: list[bytes]) -> list[Entry]:
    """The entry of each instruction (its bytes)."""
    index = analysed
    missing = [raw for raw in dict.fromkeys(raws) if raw not in index]
    if missing and kept_entries:
        assert _restore is not None
        for raw in missing:
            kept = kept_entries.pop(raw, None)
            if kept is not None:
                index[raw] = _restore(kept)
        missing = [raw for raw in missing if raw not in index]
    if missing:
        if len(index) + len(missing) > MAX_ENTRIES:
            index.clear()
        _add(missing)
    return [index[raw] for raw in raws]


class _Rows:
    """What the entries read of a Decoded, as Python lists (indexing a list is
    ~20× faster than indexing numpy one element at a time); the operands only
    of the instructions with a memory operand (``mem_row[k]``: their row)."""

    op_type: list[list[int]]
    op_reg: list[list[int]]
    op_imm: list[list[int]]
    op_size: list[list[int]]
    op_access: list[list[int]]
    mem_segment: list[list[int]]
    mem_base: list[list[int]]
    mem_index: list[list[int]]
    mem_scale: list[list[int]]
    mem_disp: list[list[int]]

    def __init__(self, d: Decoded):
        self.d = d
        self.id = d.id.tolist()
        self.relative = d.has_group(CS_GRP_BRANCH_RELATIVE).tolist()
        self.jump = (d.has_group(CS_GRP_JUMP) & ~d.has_group(CS_GRP_RET)).tolist()
        self.call = d.has_group(CS_GRP_CALL).tolist()
        self.count = d.op_count.tolist()
        self.imm0 = d.op_imm[:, 0].tolist()
        self.imm_size = d.imm_size.tolist()
        self.modrm_offset = d.modrm_offset.tolist()
        self.disp_offset = d.disp_offset.tolist()
        self.r11 = _uses_r11(d).tolist()
        rows = np.nonzero((d.op_type == X.X86_OP_MEM).any(axis=1))[0]
        self.mem_row = {k: r for r, k in enumerate(rows.tolist())}
        for name in ("op_type", "op_reg", "op_imm", "op_size", "op_access", "mem_segment",
                     "mem_base", "mem_index", "mem_scale", "mem_disp"):
            setattr(self, name, getattr(d, name)[rows].tolist())
        self._regs: list | None = None
        self._rows = rows

    def registers(self, k: int) -> set[int]:
        """What ``cs_regs_access`` reports of instruction ``k`` (a memory
        instruction): its implicit registers, its register operands read or
        written, its memory operands' segment, base and index."""
        if self._regs is None:
            detail = self.d.detail[self._rows]
            self._regs = [detail["regs_read"].tolist(), detail["regs_read_count"].tolist(),
                          detail["regs_write"].tolist(), detail["regs_write_count"].tolist()]
        read, nread, written, nwritten = self._regs
        row = self.mem_row[k]
        regs = set(read[row][:nread[row]])
        regs.update(written[row][:nwritten[row]])
        access, reg = self.op_access[row], self.op_reg[row]
        for slot, kind in enumerate(self.op_type[row][:self.count[k]]):
            if kind == X.X86_OP_REG:
                if access[slot] & 3:
                    regs.add(reg[slot])
            elif kind == X.X86_OP_MEM:
                for r in (self.mem_segment[row][slot], self.mem_base[row][slot],
                          self.mem_index[row][slot]):
                    if r != X.X86_REG_INVALID:
                        regs.add(r)
        return regs


def _uses_r11(d: Decoded) -> np.ndarray:
    """Whether each instruction reads or writes r11 (or a part of it): as a
    register operand, in a memory operand's address, or implicitly (as capstone
    reports it)."""
    def r11(ids):          # a table lookup (np.isin sorted each time: a sixth of an analysis)
        return np.take(_R11_TABLE, ids, mode="clip")
    slots = np.arange(d.op_type.shape[1]) < d.op_count[:, None]
    reg = (d.op_type == X.X86_OP_REG) & r11(d.op_reg)
    mem = (d.op_type == X.X86_OP_MEM) & (r11(d.mem_base) | r11(d.mem_index))
    out = ((reg | mem) & slots).any(axis=1)
    for name in ("regs_read", "regs_write"):
        regs = d.detail[name]
        counted = np.arange(regs.shape[1]) < d.detail[name + "_count"][:, None]
        out |= (r11(regs) & counted).any(axis=1)
    return out


def _add(missing: list[bytes]) -> None:
    blob = b"".join(missing)
    d = decode(blob, 0)
    rows = _Rows(d)
    at = 0
    row = {int(a): k for k, a in enumerate(d.address.tolist())}
    made = []
    for raw in missing:
        k = row.get(at)
        if k is not None and d.size[k] == len(raw):
            made.append((raw, rows, k, at))
        else:                               # decoded differently next to the others: alone
            made.append((raw, _Rows(decode(raw, at)), 0, at))
        at += len(raw)
    checks: list[tuple[ProbePlan, _Rows, int, bytes, int]] = []
    made_entries = [(raw, _entry(raw, r, k, address, checks), r.r11[k])
                    for raw, r, k, address in made]
    _check(checks)
    for raw, e, r11 in made_entries:
        e.r11 = r11
        analysed[raw] = e.finish()


def _entry(raw: bytes, r: _Rows, k: int, address: int, checks: list) -> Entry:
    insn_id = r.id[k]
    d = r.d
    mnemonic = d.mnemonic(k)
    if insn_id in REFUSED:
        return Entry(len(raw), REFUSE, False, mnemonic, "")
    call = r.call[k]
    if r.relative[k]:
        e = Entry(len(raw), BRANCH, call, mnemonic, "")
        e.rel = r.imm0[k] - address
        loop = insn_id in BRANCH_LOOPS
        head = branch_head(raw, r.imm_size[k], loop, "")
        if isinstance(head, str):
            if head.startswith("unsupported"):
                head = str(branch_head(raw, r.imm_size[k], loop, f"{mnemonic} {d.op_str(k)}"))
            e.head_why = head
            e.planned = 9 if insn_id in LOOPS else 0
        else:
            e.head = head
            e.planned = 9 if insn_id in LOOPS else len(head) + 4
            if e.planned != len(head) + 4:
                e.size_why = f"is {len(head) + 4} bytes, planned {e.planned}"
        return e
    text = f"{mnemonic} {d.op_str(k)}"
    if r.jump[k]:
        e = Entry(len(raw), STUB, call, mnemonic, text)
        view = e.view = d.view(k)
        e.stub_why = stub_refusal(view)
        if e.stub_why is None:
            try:
                e.planned = STUB_SIZE + target_load_size(view)
            except ValueError as exc:      # a displacement beyond 32 bits
                e.error = exc
        row = r.mem_row.get(k)
        if e.stub_why is None and e.error is None and row is not None:
            mem = memory_instruction(0, len(raw), mnemonic, d.op_str(k),
                                     _operands(r, row, r.op_type[row][:r.count[k]]))
            if len(mem.operands) == 1 and mem.operands[0].index is None:
                e.mem, e.plan = mem, _target_plan(mem, JMP_R11)     # a tail call through memory
        return e
    row = r.mem_row.get(k)
    if row is None:
        return Entry(len(raw), COPY, call, mnemonic, text)
    count = r.count[k]
    types = r.op_type[row][:count]
    bases = r.mem_base[row]
    disps = r.mem_disp[row]
    rip_disps = [disps[slot] for slot, t in enumerate(types)
                 if t == X.X86_OP_MEM and bases[slot] == X.X86_REG_RIP]
    e = Entry(len(raw), RIP if rip_disps else COPY, call, mnemonic, text)
    if rip_disps:
        found = rip_field(raw, r.disp_offset[k], rip_disps[0])
        if isinstance(found, str):
            e.rip_why = found
        else:
            e.rip_field, e.rip_disp = found
    mem = memory_instruction(0, len(raw), mnemonic, d.op_str(k), _operands(r, row, types))
    if mem.operands:
        e.mem = mem
        e.plan = _plan(raw, r, k, mem, text, checks)
    return e


def _operands(r: _Rows, row: int, types: list[int]) -> list:
    out: list[tuple] = []
    for slot, kind in enumerate(types):
        if kind != X.X86_OP_MEM:
            out.append((kind, 0, 0, None, None, 0, 0, 0))
            continue
        out.append((kind, r.op_access[row][slot], r.mem_segment[row][slot],
                    REG_NAMES[r.mem_base[row][slot]] or None,
                    REG_NAMES[r.mem_index[row][slot]] or None,
                    r.mem_scale[row][slot], r.mem_disp[row][slot], r.op_size[row][slot]))
    return out


# ------------------------------------------------------------------- probes
STACK_POINTER = "uses the stack pointer"


def probe_refusal(mem: MemInstruction | None, registers) -> str | None:
    """Why the instruction cannot take a probe (None: it can); ``registers()``:
    the names of the 64-bit registers (and ah..dh) it uses."""
    why = redirectable(mem)
    if why is not None or mem is None:
        return why
    why = operand_refusal(mem.operands[0])
    if why is None and "rsp" in registers():
        return STACK_POINTER
    return why


def operand_refusal(op) -> str | None:
    """Why a probe cannot compute the address of the memory operand ``op``."""
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
    return None


def register_names(ids) -> set[str]:
    """The 64-bit registers (and ah..dh) among capstone register ids."""
    names = {REG_NAMES[r] for r in ids}
    parents = {parent64(n) for n in names if n}
    return {p for p in parents if p} | {n for n in names if n in HIGH_BYTE}


def address_reg(used: set[str], raw: bytes) -> str | None:
    choices: tuple[str, ...] = ADDRESS_REGS
    if used & HIGH_BYTE or raw[:1] == b"\xc5" or any(b == 0xC5 for b in raw[:4]):
        choices = LOW_ADDRESS_REGS        # no REX (ah..dh), or a 2-byte VEX: no B bit
    for reg in choices:
        if reg not in used:
            return reg
    return None


def operand_lea(op) -> bytes:
    """``lea rcx, [operand]`` of a MemOperand that is not RIP-relative."""
    return lea(REG["rcx"], REG[op.base] if op.base else None, REG[op.index] if op.index else None,
               op.scale or 1, op.disp)


CALL_TARGET = "r11"       # holds a call's target between the probe and the call
CALL_R11 = b"\x41\xff\xd3"   # call r11


JMP_R11 = b"\x41\xff\xe3"    # jmp r11


def _call_plan(mem: MemInstruction) -> ProbePlan:
    """``call [m]`` becomes ``mov r11, [m]`` in the probe (the load recorded, made
    through the alias), then ``call r11`` once the probe's frame is gone: the
    callee gets the stack and every register as the call gave them, but r11,
    which the SysV ABI leaves to the caller and no argument is passed in."""
    return _target_plan(mem, CALL_R11)


def _target_plan(mem: MemInstruction, after: bytes) -> ProbePlan:
    """A call or jump through memory: its target loaded into r11 in the probe,
    then ``after`` (``call r11``, ``jmp r11``).  A jump through memory without
    an index register is a tail call (PyObject_Malloc's ``jmp [rip + _PyObject
    + 8]``, a type slot's ``jmp [rax + 0x30]``): r11 is as free there as at a
    call.  Such a jump takes this plan only in a function that never uses r11
    (copy_analysis.py): a jump to the function's own code (a computed goto)
    then cannot clobber a value the function keeps in r11; it reaches the
    original code, which is correct (the thread is moved to the copy at its
    next traced access), where the stub would have found the copy."""
    what = "call" if after == CALL_R11 else "jmp"
    if len(mem.operands) != 1 or mem.operands[0].size != 8:
        return ProbePlan(f"'{what}' through an unusual operand")
    op = mem.operands[0]
    why = operand_refusal(op)
    if why is not None:
        return ProbePlan(why)
    reg = address_reg({CALL_TARGET, *(r for r in (op.base, op.index) if r and r != "rip")}, b"")
    if reg is None:
        return ProbePlan("no free register")
    r = REG[reg]
    load = bytes([0x4C | (r >> 3), 0x8B, (REG[CALL_TARGET] & 7) << 3 | (r & 7)])  # mov r11, [rA]
    if op.base == "rip":
        return ProbePlan(None, reg, bytes(7), True, op.disp, load, after=after)
    return ProbePlan(None, reg, operand_lea(op), False, 0, load, after=after)


def _plan(raw: bytes, r: _Rows, k: int, mem: MemInstruction, text: str, checks: list) -> ProbePlan:
    if r.call[k]:
        return _call_plan(mem)
    used: list[set[str]] = []

    def registers() -> set[str]:
        if not used:
            used.append(register_names(r.registers(k)))
        return used[0]

    if is_string(mem):
        refused, on, lead, body, kind, loop = string_plan(raw, mem)
        if refused is not None:
            return ProbePlan(refused)
        return ProbePlan(None, on, lead, False, 0, body, string=kind, loop=loop)
    why = probe_refusal(mem, registers)
    if why == STACK_POINTER and mem.mnemonic == "push":
        return _push_plan(raw, mem, registers())
    if why is not None:
        return ProbePlan(why)
    reg = address_reg(registers(), raw)
    if reg is None:
        return ProbePlan("no free register")
    out = rebased(raw, r.modrm_offset[k], text, REG[reg])
    if not isinstance(out, bytes):
        return ProbePlan(str(out))
    op = mem.operands[0]
    if op.base == "rip":
        plan = ProbePlan(None, reg, bytes(7), True, op.disp, out)
    else:
        plan = ProbePlan(None, reg, operand_lea(op), False, 0, out)
    checks.append((plan, r, k, out, REG_ID[reg]))
    return plan


def _push_plan(raw: bytes, mem: MemInstruction, used: set[str]) -> ProbePlan:
    """``push qword ptr [m]``: the probe's frame lies where the push would write,
    so the instruction is not run on [rA] inside it. The probe loads the value
    (``mov rA, [rA]``, the access, through the alias as any probe's) and the
    probe's tail (function_copy.py) stores it where the push puts it, just
    below the thread's stack pointer, and pops the frame 8 bytes short
    (``stack``). The stack is not traced: the push's store is no record."""
    op = mem.operands[0]
    if op.size != 8:
        return ProbePlan(f"'push' of a {op.size}-byte operand")
    reg = address_reg(used, raw)
    if reg is None:
        return ProbePlan("no free register")
    value = load(REG[reg], REG[reg], None, 1, 0)
    if op.base == "rip":
        return ProbePlan(None, reg, bytes(7), True, op.disp, value, stack=-8)
    return ProbePlan(None, reg, operand_lea(op), False, 0, value, stack=-8)


def _check(checks: list) -> None:
    """Each re-encoding decoded again (all in one sweep) and compared with its
    instruction (``rebase_problem``): the plan of one that differs gets
    the reason (``ProbePlan.check``)."""
    if not checks:
        return
    blob = b"".join(out for _p, _r, _k, out, _reg in checks)
    new = decode(blob, 0)
    rows = _Rows(new)
    row = {int(a): j for j, a in enumerate(new.address.tolist())}
    at = 0
    for plan, r, k, out, reg in checks:
        j = row.get(at)
        at += len(out)
        if j is not None and new.size[j] == len(out) and _same(r, k, rows, j, reg):
            continue
        if j is None or new.size[j] != len(out):
            alone = decode(out, 0, 1)
            seen = alone.view(0) if alone.n else None
        else:
            seen = new.view(j)
        problem = rebase_problem(r.d.view(k), seen, REG[REG_NAMES[reg]])
        if problem is not None:
            plan.why = plan.check = problem


def _same(r: _Rows, k: int, new: _Rows, j: int, reg: int) -> bool:
    """``rebase_problem`` finds nothing (the common case, without its objects)."""
    count = r.count[k]
    if new.count[j] != count or new.d.mnemonic(j) != r.d.mnemonic(k):
        return False
    row, new_row = r.mem_row[k], new.mem_row.get(j)
    if new_row is None:
        return False
    kinds = r.op_type[row]
    if kinds[:count] != new.op_type[new_row][:count] or \
            r.op_size[row][:count] != new.op_size[new_row][:count]:
        return False
    for slot in range(count):
        kind = kinds[slot]
        if kind == X.X86_OP_MEM:
            if (new.mem_base[new_row][slot], new.mem_index[new_row][slot],
                    new.mem_disp[new_row][slot], new.mem_segment[new_row][slot]) != \
                    (reg, X.X86_REG_INVALID, 0, X.X86_REG_INVALID):
                return False
        elif kind == X.X86_OP_REG and r.op_reg[row][slot] != new.op_reg[new_row][slot]:
            return False
        elif kind == X.X86_OP_IMM and r.op_imm[row][slot] != new.op_imm[new_row][slot]:
            return False
    return True
