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
  ``want_probe``, their instruction ``mem_index``, ``plans`` (insn_entries
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
from .insn_entries import BRANCH, COPY, REFUSE, RIP, STUB, Entry, ProbePlan, entries
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
        self.address: list[int] = (offsets + start).tolist()
        self.size: list[int] = sizes.tolist()
        raws = [code[o:o + z] for o, z in zip(offsets.tolist(), self.size)]
        ents = entries(raws)
        self.kind = np.array([e.kind for e in ents], dtype=np.int8)
        self.planned = np.array([e.planned for e in ents], dtype=np.int64)
        self.calls = np.array([i for i, e in enumerate(ents) if e.call], dtype=np.int64)
        self.sides: dict[int, int] = {}
        self.targets: set[int] = set()
        self.has_stub = bool((self.kind == STUB).any())
        self.branch_index: list[int] = []
        self.branch_target: list[int] = []
        self.branch_field: list[int] = []
        self.branch_fails: dict[int, str] = {}
        self.size_fails: dict[int, str] = {}
        self.rip_index: list[int] = []
        self.rip_field: list[int] = []
        self.rip_target: list[int] = []
        self.rip_fails: dict[int, str] = {}
        self.rip_text: list[str] = []
        self.stub_index: list[int] = []
        self.stub_fields: list[tuple[int, int, int, int]] = []   # load, rip disp, table, base
        self.stub_rip_target: list[int] = []
        self.mems: list[MemInstruction] = []
        self.mem_index: list[int] = []
        self.plans: list[ProbePlan] = []
        self.whys: list[str | None] = []
        self.rip_targets: list[int] = []
        self.pieces: dict[int, bytes] = {}      # pieces that are not the instruction's bytes
        self._special(ents, raws)
        if self.refusal is None:
            self._lay_blob()

    def _special(self, ents: list[Entry], raws: list[bytes]) -> None:
        starts = set(self.address)
        for i, e in enumerate(ents):
            kind = e.kind
            if kind == COPY and e.mem is None:
                continue
            address = self.address[i]
            if kind == REFUSE:
                self.refusal = Refusal(f"'{e.mnemonic}' at {address:#x}")
                return
            if kind == BRANCH:
                if not self._branch(e, i, address, raws[i], starts):
                    return
                continue
            if kind == STUB:
                if not self._stub(e, i, address):
                    return
                continue
            if e.mem is not None and e.plan is not None:
                mem = e.mem.at(address)
                plan = e.plan
                self.mems.append(mem)
                self.mem_index.append(i)
                self.plans.append(plan)
                self.whys.append(plan.why_at(e.text, address))
                self.rip_targets.append(mem.end + plan.disp if plan.rip else 0)
            if kind == RIP:
                self.rip_index.append(i)
                self.rip_text.append(f"'{e.text}'")
                self.rip_field.append(e.rip_field)
                self.rip_target.append(address + e.size + e.rip_disp)
                if e.rip_why is not None:
                    self.rip_fails[i] = f"'{e.text}' at {address:#x}: {e.rip_why}"

    def _branch(self, e: Entry, i: int, address: int, raw: bytes, starts: set[int]) -> bool:
        start, end = self.start, self.end
        target = address + e.rel
        if start < target < end and target not in starts:
            host = self._prefixed_host(target, starts)
            if host is None:
                self.refusal = Refusal(f"branch at {address:#x} into the middle of an instruction")
                return False
            self.sides[target] = host
        if start <= target < end:
            self.targets.add(target)
        if e.call and target == address + e.size:
            self.refusal = Refusal(f"call of the next instruction at {address:#x}")
            return False
        if e.head_why is not None:
            why = e.head_why
            if why.startswith("unsupported relative branch"):     # its target, as printed here
                insn = decode_one(raw, address)
                why = f"unsupported relative branch {insn.mnemonic} {insn.op_str}"
            self.branch_fails[i] = f"branch at {address:#x}: {why}"
        elif e.size_why is not None:
            self.size_fails[i] = f"internal: branch at {address:#x} {e.size_why}"
        planned = e.planned
        self.pieces[i] = (e.head + bytes(4))[:planned].ljust(planned, b"\0")
        self.branch_index.append(i)
        self.branch_target.append(target)
        self.branch_field.append(len(e.head))
        return True

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

    def _stub(self, e: Entry, i: int, address: int) -> bool:
        if e.stub_why:
            self.refusal = Refusal(f"indirect jump '{e.text}' at {address:#x}: {e.stub_why}")
            return False
        if e.error is not None:
            raise e.error
        piece, fields, rip_target = stub_template(e.view, self.start, self.end)
        if len(piece) != e.planned:
            self.size_fails[i] = f"internal: stub at {address:#x} is {len(piece)} bytes, " \
                f"planned {e.planned}"
        self.pieces[i] = piece.ljust(e.planned, b"\0")[:e.planned]
        self.stub_index.append(i)
        self.stub_fields.append(fields)
        self.stub_rip_target.append(address + rip_target if rip_target else 0)
        return True

    def _lay_blob(self) -> None:
        self.blob_at = np.zeros(self.n + 1, np.int64)
        np.cumsum(self.planned, out=self.blob_at[1:])
        if not self.pieces:
            self.blob = self.code
            return
        parts = []
        code, start = self.code, self.start
        at = 0             # offset in code of the first instruction not in parts yet
        for i in sorted(self.pieces):
            offset = self.address[i] - start
            parts.append(code[at:offset])
            parts.append(self.pieces[i])
            at = offset + self.size[i]
        parts.append(code[at:])
        self.blob = b"".join(parts)
        self.pieces = {}


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
