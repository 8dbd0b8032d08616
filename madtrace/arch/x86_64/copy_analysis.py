# SPDX-License-Identifier: GPL-2.0-or-later
"""What a function copy needs to know of a function, wherever the copy goes.

``analyse(code, start, end) -> FunctionAnalysis | Refusal`` finds the
function's instructions (one sweep of capstone's C decoder, decode.py),
takes what each one is from insn_entries.py (by its bytes, decoded with
detail once per process) and works out everything of its copy that depends
neither on where the copy is placed nor on which instructions take a probe;
function_copy.py's ``copy_function`` then lays the copy out and fills in its
addresses.  A function copied again (an instruction discovered later) is
not analysed again: the rewriter keeps its analysis.

``FunctionAnalysis``:

* ``refusal``: why the function cannot be copied at all (the first
  instruction, in address order, that refuses it), or None;
* per instruction, in address order: ``address``, ``size`` (lists),
  ``offset``, ``insn_size``, ``kind`` (insn_entries ``COPY``, ``RIP``,
  ``BRANCH``, ``STUB``) and ``planned`` (the size of its piece in a copy when
  it takes no probe) as numpy columns; ``calls`` (indices);
* ``blob``, ``blob_at``: the pieces of every instruction without probe, laid
  end to end (piece ``i`` is ``blob[blob_at[i]:blob_at[i + 1]]``), with the
  fields that depend on addresses left for the copy to fill: a branch's rel32
  (``branch_*``), a RIP-relative displacement (``rip_*``), an indirect jump
  stub's target load, table and base (``stub_*``);
* pieces that cannot be made wherever the copy goes (``branch_fails``,
  ``rip_fails``) and pieces whose size is not the one planned
  (``size_fails``), by instruction index, with the copy's refusal;
* ``mems`` (``MemInstruction``) of the memory instructions offered to
  ``want_probe`` (a jump through memory among them: a probe then takes the
  place of its stub), their instruction ``mem_index``, ``plans`` (insn_entries
  ``ProbePlan``), ``whys`` (why no probe, None if one fits) and
  ``rip_targets`` (a RIP-relative operand's address, else 0);
* ``sides`` (branch target past an instruction's prefixes -> that
  instruction's index), ``targets``, ``has_stub``.

Reasons and bytes are those of the per-instruction code this replaced:
bench/bench_copier.py compares copies with main's copier on every function
of python3, libc and the test programs.
"""

from __future__ import annotations

import numpy as np

from .copy_encode import LEGACY_PREFIXES
from .decode import as_buffer, decode_one, sweep
from .insn_entries import BRANCH, ERROR, HEAD_WHY, MEM, R11, REFUSE, RIP, RIP_WHY, SIZE_WHY, STUB, \
    Entry, ProbePlan, entries
from .jump_stubs import stub_template
from .memops import MemInstruction
from .relocate import Refusal

PROBE = 4


class FunctionAnalysis:
    """See the module docstring."""

    def __init__(self, code: bytes, start: int, end: int, offsets: np.ndarray, sizes: np.ndarray):
        self.code, self.start, self.end, self.n = code, start, end, len(offsets)
        self.refusal: Refusal | None = None
        self.offset = offsets
        self.insn_size = sizes
        addresses = offsets + start
        self.address: list[int] = addresses.tolist()
        self.size: list[int] = sizes.tolist()
        raws = [code[o:o + z] for o, z in zip(offsets.tolist(), self.size)]
        ents = entries(raws)
        self.entries: list[Entry] | None = ents    # None once read from the disk (text())
        rows = np.array([e.row for e in ents], dtype=np.int64).reshape(-1, 6)
        kind, flags = rows[:, 0], rows[:, 4]
        self.kind = kind.astype(np.int8)
        self.planned = rows[:, 1].copy()
        self.calls = np.nonzero(rows[:, 2])[0]
        self.has_stub = bool((kind == STUB).any())
        # direct branches
        self.branch_index = bi = np.nonzero(kind == BRANCH)[0]
        self.branch_target = target = addresses[bi] + rows[bi, 5]
        self.branch_field = rows[bi, 3]
        inside = (target >= start) & (target < end)
        self.targets = set(target[inside].tolist())
        at = np.minimum(np.searchsorted(offsets, target - start), max(self.n - 1, 0))
        middle = inside & (offsets[at] != target - start)
        self.sides: dict[int, int] = {}
        refusals = self._refusals(ents, kind, bi, target, middle, addresses + sizes)
        if refusals:
            i, why = min(refusals)
            errors = [j for j in np.nonzero(flags & ERROR)[0].tolist() if j < i]
            if errors:
                raise ents[errors[0]].error or ValueError
            self.refusal = Refusal(why)
            return
        for j in np.nonzero(flags & ERROR)[0].tolist():
            raise ents[j].error or ValueError
        self.branch_fails = {i: self._head_why(i) for i in np.nonzero(flags & HEAD_WHY)[0].tolist()}
        self.size_fails = {i: f"internal: branch at {self.address[i]:#x} {ents[i].size_why}"
                           for i in np.nonzero(flags & SIZE_WHY)[0].tolist()}
        # RIP-relative operands
        self.rip_index = ri = np.nonzero(kind == RIP)[0]
        self.rip_field = rows[ri, 3]
        self.rip_target = addresses[ri] + sizes[ri] + rows[ri, 5]
        self.rip_fails = {i: f"'{ents[i].text}' at {self.address[i]:#x}: {ents[i].rip_why}"
                          for i in np.nonzero(flags & RIP_WHY)[0].tolist()}
        # memory instructions; a jump through memory only where r11 is free for its
        # probe (insn_entries.py _target_plan): else its stub loads the target (and
        # faults on a traced page)
        mems = (flags & MEM) != 0
        if (flags & R11).any():
            mems &= kind != STUB
        self.mem_index: list[int] = np.nonzero(mems)[0].tolist()
        self.mems: list[MemInstruction] = []
        self.plans: list[ProbePlan] = []
        self.whys: list[str | None] = []
        self.rip_targets: list[int] = []
        for i in self.mem_index:
            e = ents[i]
            address = self.address[i]
            plan = e.plan
            assert e.mem is not None and plan is not None
            mem = e.mem.at(address)
            self.mems.append(mem)
            self.plans.append(plan)
            self.whys.append(plan.why_at(e.text, address))
            self.rip_targets.append(mem.end + plan.disp if plan.rip else 0)
        # indirect jumps
        self.stub_index: list[int] = np.nonzero(kind == STUB)[0].tolist()
        self.stub_fields: list[tuple[int, int, int, int]] = []   # load, rip disp, table, base
        self.stub_rip_target: list[int] = []
        pieces = {int(i): ents[i].piece for i in bi.tolist()}
        for i in self.stub_index:
            pieces[i] = self._stub(ents[i], i)
        self._lay_blob(pieces)

    def text(self, i: int) -> str:
        """Instruction ``i``'s disassembly (for a reason)."""
        if self.entries is None:        # an analysis from the disk (data/hybrid/analysis_cache.py)
            o = int(self.offset[i])
            return entries([self.code[o:o + self.size[i]]])[0].text
        return self.entries[i].text

    def _refusals(self, ents: list[Entry], kind: np.ndarray, bi: np.ndarray, target: np.ndarray,
                  middle: np.ndarray, ends: np.ndarray) -> list[tuple[int, str]]:
        """(instruction index, why) of each instruction that refuses the function."""
        found = [(i, f"'{ents[i].mnemonic}' at {self.address[i]:#x}")
                 for i in np.nonzero(kind == REFUSE)[0].tolist()]
        starts = None
        for k in np.nonzero(middle)[0].tolist():
            i, t = int(bi[k]), int(target[k])
            if starts is None:
                starts = set(self.address)
            host = self._prefixed_host(t, starts)
            if host is None:
                found.append((i, f"branch at {self.address[i]:#x} into the middle of an instruction"))
            else:
                self.sides[t] = host
        calls = np.nonzero(np.isin(bi, self.calls) & (target == ends[bi]))[0]
        found += [(int(bi[k]), f"call of the next instruction at {self.address[int(bi[k])]:#x}")
                  for k in calls.tolist()]
        for i in np.nonzero(kind == STUB)[0].tolist():
            if ents[i].stub_why:
                found.append((i, f"indirect jump '{ents[i].text}' at {self.address[i]:#x}: "
                                 f"{ents[i].stub_why}"))
        return found

    def _head_why(self, i: int) -> str:
        assert self.entries is not None
        why = self.entries[i].head_why or ""
        if why.startswith("unsupported relative branch"):     # its target, as printed here
            insn = decode_one(self.code[self.offset[i]:self.offset[i] + self.size[i]], self.address[i])
            why = f"unsupported relative branch {insn.mnemonic} {insn.op_str}"
        return f"branch at {self.address[i]:#x}: {why}"

    def _prefixed_host(self, target: int, starts: set[int]) -> int | None:
        """The instruction ``target`` lies in when only legacy prefixes precede it
        there (a branch that skips a ``lock``), else None."""
        for back in range(1, 15):
            host = target - back
            if host in starts:
                i = int(np.searchsorted(self.offset, host - self.start))
                raw = self.code[host - self.start:target - self.start]
                if target < host + self.size[i] and all(b in LEGACY_PREFIXES for b in raw):
                    return i
                return None
        return None

    def _stub(self, e: Entry, i: int) -> bytes:
        assert e.view is not None
        piece, fields, rip_target = stub_template(e.view, self.start, self.end)
        if len(piece) != e.planned:
            self.size_fails[i] = f"internal: stub at {self.address[i]:#x} is {len(piece)} bytes, " \
                f"planned {e.planned}"
        self.stub_fields.append(fields)
        self.stub_rip_target.append(self.address[i] + rip_target if rip_target else 0)
        return piece.ljust(e.planned, b"\0")[:e.planned]

    def _lay_blob(self, pieces: dict[int, bytes]) -> None:
        self.blob_at = np.zeros(self.n + 1, np.int64)
        np.cumsum(self.planned, out=self.blob_at[1:])
        if not pieces:
            self.blob = self.code
            return
        parts = []
        code, start = self.code, self.start
        at = 0             # offset in code of the first instruction not in parts yet
        for i in sorted(pieces):
            offset = self.address[i] - start
            parts.append(code[at:offset])
            parts.append(pieces[i])
            at = offset + self.size[i]
        parts.append(code[at:])
        self.blob = b"".join(parts)


def analyse(code: bytes, start: int, end: int) -> FunctionAnalysis | Refusal:
    size = end - start
    code = bytes(code[:size])
    offsets, sizes = sweep(as_buffer(code), start, 0, size)
    # capstone stops at the first byte it cannot decode: so does the copy
    expected = np.concatenate(([0], np.cumsum(sizes)))
    gap = np.nonzero(offsets != expected[:-1])[0]
    if len(gap):
        return Refusal(f"undecodable instruction at {start + int(expected[gap[0]]):#x}")
    pos = int(expected[-1])
    if pos != size:
        return Refusal(f"undecodable instruction at {start + pos:#x}")
    return FunctionAnalysis(code, start, end, offsets, sizes)
