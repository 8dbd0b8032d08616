# SPDX-License-Identifier: GPL-2.0-or-later
"""Whole-function relocation with data probes (the hybrid data engine's rewriter).

``copy_function(code, start, end, address, injector, want_probe, new_id, ctl,
bitmap, analysis=None) -> FunctionCopy | Refusal`` re-encodes the function
[start, end) (``code``: its bytes) to run at ``address``:

* relative branches become rel32 branches (``jrcxz``/``loop``: ``jrcxz +2;
  jmp +5; jmp rel32``) to the copy of their target when it lies in the
  function, to the original target otherwise; a RIP-relative operand keeps
  its target (code and data are not moved, only the instructions);
* an instruction ``want_probe`` selects that has one memory operand the
  probe can take (``probe_refusal``) becomes probe_head, ``lea rcx,
  [operand]``, probe (injector/trampolines.S), then the instruction itself
  on ``[rA]``, rA a register it does not use, saved in the probe's frame:
  it records its access into the thread's ring and reaches the data through
  the alias when the page is aliased; a call through memory (``call [m]``:
  CPython's type slots, calls through the GOT) is ``mov r11, [rA]`` in the
  probe, then ``call r11`` after it (insn_entries.py ``_call_plan``), and so
  is a jump through memory without an index (a tail call), with ``jmp r11``,
  in a function that does not use r11;
* a string instruction (movs, stos, lods, scas, cmps) takes a probe of one
  iteration on its implicit rsi/rdi, and a rep prefix a loop around it
  (string_probes.py);
* any other indirect jump (a switch table, a computed goto) becomes a stub that
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
``unprobed`` (memory instructions left as they are, and why);
``original_of``, ``probe_at``, ``probe_of``: sorted look-ups, made once.

How: ``analyse(code, start, end)`` (copy_analysis.py) works out, once per
function, everything that depends neither on ``address`` nor on the probes
chosen: the pieces of every instruction, end to end, with their
address-dependent fields left empty.  A copy asks ``want_probe`` about each
memory instruction (in address order), lays the pieces out (a cumulative
sum), finds the first piece that cannot be made (the refusal the pieces, made
in order, would meet first; ``new_id`` is called for the probes up to it,
in order), then joins the analysis's bytes with the probes put in and fills
branch, RIP-relative and stub fields with numpy.  The rewriter passes the
``analysis`` it kept for the function; without one (or of other bytes) the
function is analysed first.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field

import numpy as np
from capstone import x86_const as X

from .copy_analysis import PROBE, FunctionAnalysis, analyse
from .copy_encode import REG, lea_rip, lea_rsp, load_rsp, rip_displaced, store_rsp
from .decode import capstone_detail
from .insn_entries import RIP, ProbePlan, probe_refusal
from .jump_stubs import FRAME
from .relocate import Refusal, encode_jmp
from .string_probes import PAIR, StringProbes, pair_operands

__all__ = ["Probe", "Stub", "FunctionCopy", "FunctionAnalysis", "copy_function", "analyse",
           "probe_refusal", "FRAME"]
_I32 = (-(1 << 31), 1 << 31)


@dataclass
class Probe:
    original: int       # the instruction, in the original code
    start: int          # the probe, in the copy
    body: int           # where template "probe" begins (after the address computation)
    insn: int           # the instruction on [reg]
    insn_end: int
    end: int            # the next instruction of the copy
    reg: str            # rA
    ident: int          # instruction id (its data records; a movs: its load's)
    string: int = 0     # a string instruction's probe (string_probes.py): ONE, PAIR ...
    loop: int = 0       # ... its rep loop (REP, REPE, REPNE) ...
    head: int = 0       # ... where the probe proper begins (after the loop's first jump) ...
    last: int = 0       # ... and the end of the loop
    stack: int = 0      # the instruction's own move of rsp (a push: -8), made by the probe's tail


@dataclass
class Stub:
    """An indirect jump's translation stub (jump_stubs.py)."""
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
    # probes and stubs as plain tuples of their fields (``probes``, ``stubs`` make the
    # objects): the garbage collector stops tracking such tuples, and a run keeps
    # hundreds of thousands (its full collections then cost less)
    probe_rows: list[tuple] = field(default_factory=list)
    unprobed: dict[int, str] = field(default_factory=dict)
    targets: frozenset = frozenset()     # the function's own direct branch targets
    stub_rows: list[tuple] = field(default_factory=list)
    code_size: int = 0                   # the code, before the jump table
    # the address after each call and system call in the copy -> the original's: where a
    # call returns, and what a system call leaves in %rcx (a stale spill of it may lie
    # in a live frame's unused slot: the stack scan at detach finds it there)
    returns: dict = field(default_factory=dict)
    # sorted lookups, made on first use (the copy does not change once made)
    _probe_starts: list | None = field(default=None, init=False, repr=False, compare=False)
    _new_sorted: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _by_original: dict | None = field(default=None, init=False, repr=False, compare=False)
    _stub_starts: list | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def probes(self) -> list[Probe]:
        """The probes, in address order."""
        return [Probe(*row) for row in self.probe_rows]

    @property
    def stubs(self) -> list[Stub]:
        """The indirect jumps' stubs, in address order."""
        return [Stub(*row) for row in self.stub_rows]

    def stub_at(self, address: int) -> Stub | None:
        """The indirect jump stub whose code holds ``address``."""
        rows = self.stub_rows
        if self._stub_starts is None or len(self._stub_starts) != len(rows):
            self._stub_starts = [row[1] for row in rows]
        i = bisect.bisect_right(self._stub_starts, address) - 1
        if i >= 0 and address < rows[i][3]:
            return Stub(*rows[i])
        return None

    @property
    def copy_end(self) -> int:
        return self.address + len(self.code)

    def probe_at(self, address: int) -> Probe | None:
        """The probe whose code holds ``address`` (an address in the copy)."""
        rows = self.probe_rows
        if self._probe_starts is None or len(self._probe_starts) != len(rows):
            self._probe_starts = [row[1] for row in rows]
        i = bisect.bisect_right(self._probe_starts, address) - 1
        if i >= 0 and address < (rows[i][11] if len(rows[i]) > 8 and rows[i][8] else rows[i][5]):
            return Probe(*rows[i])
        return None

    def probe_of(self, original: int) -> Probe | None:
        """The probe of the original instruction at ``original``."""
        rows = self.probe_rows
        if self._by_original is None or len(self._by_original) != len(rows):
            self._by_original = {row[0]: k for k, row in enumerate(rows)}
        k = self._by_original.get(original)
        return None if k is None else Probe(*rows[k])

    def original_of(self, address: int) -> int | None:
        """The original instruction whose copy holds ``address``."""
        if self._new_sorted is None or len(self._new_sorted[0]) != len(self.old_to_new):
            pairs = sorted((new, old) for old, new in self.old_to_new.items())
            self._new_sorted = ([n for n, _ in pairs], [o for _, o in pairs])
        news, olds = self._new_sorted
        i = bisect.bisect_right(news, address) - 1
        return olds[i] if i >= 0 else None


class _ProbeParts:
    """The parts of a probe that do not depend on the instruction, for one
    injector, control area and alias bitmap."""

    _made: dict = {}

    def __init__(self, injector, ctl: int, bitmap: int):
        L = injector
        self.injector = injector
        head, probe = L.templates["probe_head"], L.templates["probe"]
        self.head, self.head_size, self.template = head.code, head.size, probe
        self.template_size = probe.size
        self.ctl, self.bitmap, self.data_code = ctl, bitmap, L.MT_DATA_CODE
        points = probe.patch_points
        self.fixed = all(kind != "rel32" for pts in points.values() for _o, kind in pts) and \
            [kind for _o, kind in points.get("code", ())] == ["imm32"]
        if self.fixed:
            made = probe.instantiate(0, bitmap=bitmap, ctl=ctl, code=0)
            at = points["code"][0][0]
            self.pre, self.post = bytes(made[:at]), bytes(made[at + 4:])
        self.save = {r: store_rsp(L.MT_PF_SAVED, REG[r]) + load_rsp(REG[r], L.MT_PF_ADDR) for r in REG}
        self.restore = {r: load_rsp(REG[r], L.MT_PF_SAVED) + lea_rsp(L.MT_PROBE_FRAME) for r in REG}
        # a push (insn_entries.py ``_push_plan``): its value stored where the push puts it, the
        # 8 bytes below the thread's stack pointer; the frame popped down to that slot
        self.push_store = {r: store_rsp(L.MT_PROBE_FRAME - 8, REG[r]) for r in REG}
        self.push_restore = {r: load_rsp(REG[r], L.MT_PF_SAVED) + lea_rsp(L.MT_PROBE_FRAME - 8)
                             for r in REG}
        # the size function_copy.py always planned for a probe, but the instruction's own bytes
        self.base = self.head_size + self.template_size + 5 + 5 + 5 + 8
        self.exact = self.fixed and self.head_size == len(self.head) and \
            all(len(self.save[r]) + len(self.restore[r]) == 5 + 5 + 5 + 8 and
                len(self.push_restore[r]) == len(self.restore[r]) and
                len(self.push_store[r]) == len(self.push_store["rax"]) for r in REG)
        self.strings = StringProbes(injector, ctl, bitmap, self.head)

    @classmethod
    def of(cls, injector, ctl: int, bitmap: int) -> "_ProbeParts":
        key = (id(injector), ctl, bitmap)
        parts = cls._made.get(key)
        if parts is None or parts.injector is not injector:
            if len(cls._made) > 16:
                cls._made.clear()
            parts = cls._made[key] = cls(injector, ctl, bitmap)
        return parts

    def planned(self, plan: ProbePlan) -> int:
        if plan.string:
            return self.strings.size(plan)
        return self.base + plan.extra + (len(self.push_store["rax"]) if plan.stack else 0)

    def instruction(self, plan: ProbePlan) -> tuple[bytes, bytes]:
        """The probe's instruction part (on [rA]) and the restore after it."""
        if plan.stack:
            return plan.rebased + self.push_store[plan.reg], self.push_restore[plan.reg]
        return plan.rebased, self.restore[plan.reg]

    def prepare(self, plan: ProbePlan) -> None:
        """``plan.pieces``: the probe's bytes before its code (but a RIP-relative
        address computation) and after it, and where its parts begin."""
        lead = self.head + (b"" if plan.rip else plan.lead) + self.pre
        insn_part, restore = self.instruction(plan)
        tail = self.post + self.save[plan.reg] + insn_part + restore + plan.after
        body = len(self.head) + len(plan.lead)
        insn = body + self.template_size + len(self.save[plan.reg])
        plan.pieces = (lead, tail, body, insn, insn + len(insn_part), self.actual(plan))
        plan.made_for = self

    def actual(self, plan: ProbePlan) -> int:
        insn_part, restore = self.instruction(plan)
        return len(self.head) + len(plan.lead) + self.template_size + len(self.save[plan.reg]) + \
            len(insn_part) + len(restore)

    def code(self, ident: int) -> bytes:
        return struct.pack("<i", (self.data_code | ident) - (1 << 32))

    def probe(self, pieces: list, plan: ProbePlan, original: int, at: int, ident: int,
              rip_target: int) -> tuple:
        """The probe (``Probe``'s fields) of ``plan``'s instruction (at
        ``original``) placed at ``at``, its pieces appended to ``pieces``."""
        if plan.string:
            return self.strings.probe(pieces, plan, original, at, ident)
        if self.exact:
            if plan.made_for is not self:
                self.prepare(plan)
            lead, tail, body, insn, insn_end, end = plan.pieces
            if plan.rip:
                pieces += [self.head, lea_rip(REG["rcx"], at + len(self.head), rip_target), self.pre]
            else:
                pieces.append(lead)
            pieces += [self.code(ident), tail]
            return self._row(original, at, at + body, at + insn, at + insn_end, at + end, plan, ident)
        head = self.head
        ea = lea_rip(REG["rcx"], at + len(head), rip_target) if plan.rip else plan.lead
        start = at + len(head) + len(ea)
        save = self.save[plan.reg]
        insn_part, restore = self.instruction(plan)
        if self.fixed:
            made = [self.pre, self.code(ident), self.post]
        else:
            made = [bytes(self.template.instantiate(start, bitmap=self.bitmap, ctl=self.ctl,
                                                    code=(self.data_code | ident) - (1 << 32)))]
        pieces += [head, ea, *made, save, insn_part, restore, plan.after]
        insn = start + self.template_size + len(save)
        end = insn + len(insn_part) + len(restore)
        return self._row(original, at, start, insn, insn + len(insn_part), end, plan, ident)

    @staticmethod
    def _row(original: int, at: int, body: int, insn: int, insn_end: int, end: int,
             plan: ProbePlan, ident: int) -> tuple:
        """``Probe``'s fields: a push's carry its move of the stack pointer."""
        if plan.stack:
            return (original, at, body, insn, insn_end, end, plan.reg, ident, 0, 0, 0, 0, plan.stack)
        return (original, at, body, insn, insn_end, end, plan.reg, ident)


def copy_function(code: bytes, start: int, end: int, address: int, injector, want_probe,
                  new_id, ctl: int, bitmap: int,
                  analysis: FunctionAnalysis | None = None) -> FunctionCopy | Refusal:
    """See the module docstring; ``analysis``: ``analyse(code, start, end)`` made
    before (for a function copied again), used when it is of these bytes."""
    if analysis is None or (analysis.start, analysis.end) != (start, end) or \
            analysis.code != bytes(code[:end - start]):
        made = analyse(code, start, end)
        if isinstance(made, Refusal):
            return made
        analysis = made
    a = analysis
    if a.refusal is not None:
        return a.refusal
    parts = _ProbeParts.of(injector, ctl, bitmap)
    unprobed: dict[int, str] = {}
    chosen: list[int] = []
    whys = a.whys
    for j, mem in enumerate(a.mems):
        if want_probe(mem):
            why = whys[j]
            if why is None:
                chosen.append(j)
            else:
                unprobed[mem.address] = why
        else:
            unprobed[mem.address] = "not selected"
    return _Layout(a, parts, address, chosen).emit(new_id, unprobed)


class _Layout:
    """Where each piece of one copy goes, and the copy made from it."""

    def __init__(self, a: FunctionAnalysis, parts: _ProbeParts, address: int, chosen: list[int]):
        self.a, self.parts, self.address, self.chosen = a, parts, address, chosen
        self.kind = a.kind.copy()
        size = a.planned.copy()
        self.probe_index = [a.mem_index[j] for j in chosen]
        if chosen:
            index = np.array(self.probe_index, dtype=np.int64)
            self.kind[index] = PROBE
            plans = a.plans
            size[index] = [parts.planned(plans[j]) for j in chosen]
        self.sizes = size
        new = np.full(a.n, address, dtype=np.int64)
        new[1:] += np.cumsum(size[:-1])
        self.new = new
        self.after = address + int(size.sum())
        at = self.after + 5
        self.side_at: dict[int, int] = {}
        for target, host in sorted(a.sides.items()):
            self.side_at[target] = at
            at += a.size[host] - (target - a.address[host]) + 5
        self.code_size = at - address
        self.table_at = (at + 7) & ~7 if a.has_stub else 0

    def emit(self, new_id, unprobed: dict[int, str]) -> FunctionCopy | Refusal:
        a = self.a
        failed = self._first_failure()
        ids = []
        for j, i in zip(self.chosen, self.probe_index):
            if failed is not None and i > failed[0]:
                break
            mem = a.mems[j]
            plan = a.plans[j]
            if plan.string == PAIR:        # movs, cmps: the first access, the second after it, alone
                first, second = pair_operands(mem, plan.reg)
                ids.append((new_id(mem, first, 1), new_id(mem, second, 0), new_id(mem, second, 1)))
            else:
                ids.append(new_id(mem))
        if failed is not None:
            return Refusal(failed[1])
        old_to_new = dict(zip(a.address, self.new.tolist()))
        tail = encode_jmp(self.after, a.end)
        if tail is None:
            return Refusal(f"the end of the function {a.end:#x} is out of reach")
        pieces: list = []
        probes = self._probes(pieces, ids)
        pieces.append(tail)
        old_to_new.update(self.side_at)
        for target, host in sorted(a.sides.items()):
            side = _side(a.address[host], a.size[host], a.code, a.start, target, self.side_at[target],
                         old_to_new)
            if isinstance(side, str):
                return Refusal(side)
            pieces.append(side)
        out = bytearray(b"".join(pieces))
        if len(out) != self.code_size:
            return Refusal(f"internal: the copy is {len(out)} bytes, planned {self.code_size}")
        self._fill(out)
        if self.table_at:
            out += bytes(self.table_at - self.address - len(out)) + self._jump_table()
        new, size = self.new, self.sizes
        calls = np.union1d(a.calls, _syscalls(a.code, a.offset, a.insn_size))
        returns = dict(zip((new[calls] + size[calls]).tolist(),
                           (a.offset[calls] + a.start + a.insn_size[calls]).tolist())) \
            if len(calls) else {}
        stubs = [(a.address[i], int(new[i]), int(new[i]) + fields[0], int(new[i] + size[i]))
                 for i, fields in zip(a.stub_index, a.stub_fields) if self.kind[i] != PROBE]
        return FunctionCopy(a.start, a.end, self.address, bytes(out), old_to_new, probes, unprobed,
                            frozenset(a.targets), stubs, self.code_size, returns)

    def _probes(self, pieces: list, ids: list[int]) -> list[tuple]:
        """The pieces of the copy up to its last instruction: the analysis's blob
        with the probes put in."""
        a, parts = self.a, self.parts
        blob, blob_at = memoryview(a.blob), a.blob_at.tolist()
        new = self.new.tolist()
        prev = 0
        probes = []
        plans, mems, rip_targets = a.plans, a.mems, a.rip_targets
        for j, i, ident in zip(self.chosen, self.probe_index, ids):
            pieces.append(blob[prev:blob_at[i]])
            probes.append(parts.probe(pieces, plans[j], mems[j].address, new[i], ident,
                                      rip_targets[j]))
            prev = blob_at[i + 1]
        pieces.append(blob[prev:])
        return probes

    # ---------------------------------------------------------- addresses
    def _targets(self) -> np.ndarray:
        """Where each direct branch of the function goes in this copy."""
        a = self.a
        target = a.branch_target
        inside = (target >= a.start) & (target < a.end)
        index = np.minimum(np.searchsorted(a.offset, target - a.start), a.n - 1)
        start = inside & (a.offset[index] == target - a.start)
        out = np.where(start, self.new[index], target)
        for k in np.nonzero(inside & ~start)[0].tolist():
            out[k] = self.side_at[int(target[k])]
        return out

    def _first_failure(self) -> tuple[int, str] | None:
        """(instruction index, refusal) of the first piece of the copy that cannot be
        made, as the pieces are made in order: a piece that cannot be made anywhere
        first, then one out of reach, then one whose size is not the planned one."""
        a, kind, new, parts = self.a, self.kind, self.new, self.parts
        found = [(i, 0, why) for i, why in a.branch_fails.items()]
        found += [(i, 2, why) for i, why in a.size_fails.items()]
        found += [(i, 0, why) for i, why in a.rip_fails.items() if kind[i] == RIP]
        self.branch_values = None
        if len(a.branch_index):
            index = a.branch_index
            values = self._targets() - (new[index] + a.branch_field + 4)
            self.branch_values = values
            for k in np.nonzero(_out_of_range(values))[0].tolist():
                i = int(a.branch_index[k])
                found.append((i, 1, f"branch at {a.address[i]:#x}: target out of reach"))
        if len(a.rip_index):
            index = a.rip_index
            target = a.rip_target
            at = new[index]
            values = target - (at + a.insn_size[index])
            for k in np.nonzero(_out_of_range(values) & (kind[index] == RIP))[0].tolist():
                i = int(a.rip_index[k])
                if i not in a.rip_fails:
                    found.append((i, 1, f"'{a.text(i)}' at {a.address[i]:#x}: "
                                        f"{int(target[k]):#x} out of reach from {int(at[k]):#x}"))
        for i, fields, target in zip(a.stub_index, a.stub_fields, a.stub_rip_target):
            if kind[i] == PROBE:
                continue                      # a probe took the stub's place
            if fields[1] >= 0 and _out_of_range(target - (int(new[i]) + fields[0] + 7)):
                found.append((i, 1, f"indirect jump at {a.address[i]:#x}: its operand is out of reach"))
        head = len(parts.head)
        for j, i in zip(self.chosen, self.probe_index):
            plan = a.plans[j]
            if plan.rip and _out_of_range(a.rip_targets[j] - (int(new[i]) + head + 7)):
                found.append((i, 1, f"operand of {a.address[i]:#x} out of reach"))
            if not parts.exact and not plan.string:
                planned, actual = parts.planned(plan), parts.actual(plan)
                if planned != actual:
                    found.append((i, 2, f"internal: probe at {a.address[i]:#x} is {actual} bytes, "
                                        f"planned {planned}"))
        if not found:
            return None
        i, _rank, why = min(found)
        return i, why

    def _fill(self, out: bytearray) -> None:
        """The fields of the pieces that depend on addresses."""
        a, new, base = self.a, self.new, self.address
        code = np.frombuffer(out, dtype=np.uint8)
        if len(a.branch_index):
            index = a.branch_index
            _put(code, new[index] - base + a.branch_field, self.branch_values, 4)
        if len(a.rip_index):
            keep = self.kind[a.rip_index] == RIP
            index = a.rip_index[keep]
            at = new[index]
            _put(code, at - base + a.rip_field[keep], a.rip_target[keep] - (at + a.insn_size[index]), 4)
        for i, (load, rip, table, stub_base), target in zip(a.stub_index, a.stub_fields,
                                                             a.stub_rip_target):
            if self.kind[i] == PROBE:
                continue
            at = int(new[i])
            if rip >= 0:
                struct.pack_into("<i", out, at - base + rip, target - (at + load + 7))
            struct.pack_into("<Q", out, at - base + table, self.table_at)
            struct.pack_into("<Q", out, at - base + stub_base, base)
        del code

    def _jump_table(self) -> bytes:
        a = self.a
        table = np.full(a.end - a.start, -1, dtype=np.int32)
        table[a.offset] = self.new - self.address
        for target, at in self.side_at.items():
            table[target - a.start] = at - self.address
        return table.tobytes()


def _out_of_range(values):
    return (values < _I32[0]) | (values >= _I32[1])


def _put(code: np.ndarray, at: np.ndarray, values: np.ndarray, size: int) -> None:
    """Little-endian ``size``-byte ``values`` written at offsets ``at`` of ``code``."""
    if not len(at):
        return
    data = values.astype("<i4" if size == 4 else "<u8").view(np.uint8).reshape(-1, size)
    code[at[:, None] + np.arange(size)] = data


# ------------------------------------------------------------ side entries
def _side(host: int, host_size: int, code: bytes, start: int, target: int, at: int,
          old_to_new: dict):
    """The instruction without the prefixes the branch skips, then a jump back
    to the copy of the next instruction."""
    raw = bytes(code[target - start:host + host_size - start])
    insn = next(capstone_detail().disasm(raw, target, 1), None)
    if insn is None or insn.size != len(raw):
        return f"side entry at {target:#x}: undecodable"
    if any(op.type == X.X86_OP_MEM and op.mem.base == X.X86_REG_RIP for op in insn.operands):
        raw = rip_displaced(insn, raw, at)
        if isinstance(raw, str):
            return f"side entry at {target:#x}: {raw}"
    back = encode_jmp(at + len(raw), old_to_new[host + host_size])
    if back is None:
        return f"side entry at {target:#x}: out of reach"
    return raw + back


def _syscalls(code: bytes, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Indexes of the ``syscall`` instructions (0f 05) among the instructions at
    ``offsets`` of ``code`` (each copied as it is: its end is its return point)."""
    two = np.nonzero(sizes == 2)[0]
    if not len(two):
        return two
    raw = np.frombuffer(code, dtype=np.uint8)
    at = offsets[two]
    return two[(raw[at] == 0x0F) & (raw[at + 1] == 0x05)]
