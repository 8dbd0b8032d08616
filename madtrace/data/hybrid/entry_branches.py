# SPDX-License-Identifier: GPL-2.0-or-later
"""A copy's branches to its function's own entry, aimed at the original entry.

A branch of a function to its own first instruction (a loop that starts
there, a tail call of itself) is a call for function tracing when it patches
the entry: the branch re-enters the patch.  In a copy (function_copy.py)
such a branch reaches the copy's start instead, which would skip the entry
record.  ``to_original_entry`` aims them at the function's original entry,
whatever is there: function tracing's jump (the call is recorded, then its
trampoline goes on to the copy), the rewriter's own jump to the copy, or the
original code.  The copy stays right whether function tracing patches the
entry or not, so it can be entered from the trampoline and its first
instructions run with their probes.

Each branch is found in the copy's bytes (capstone) before it is changed:
one that is not where and what it should be leaves the copy as it was, and
the answer is False (the rewriter then copies the function with function
tracing's jump in it).
"""

from __future__ import annotations

import bisect

from capstone import CS_GRP_BRANCH_RELATIVE

from ...arch.x86_64.decode import capstone_detail
from ...arch.x86_64.encode import rel32

MASK = (1 << 64) - 1


def _branches_to(code: bytes, at: int, target: int):
    for insn in capstone_detail().disasm(code, at):
        if CS_GRP_BRANCH_RELATIVE in insn.groups and insn.operands and \
                insn.operands[0].imm & MASK == target:
            yield insn


def to_original_entry(code: bytes, start: int, copy, sources: list[int] | None = None) -> bool:
    """Re-aim the branches of ``copy`` (of the function at ``start``, whose bytes
    are ``code``) that reach the copy's start; False when one is not found.
    ``sources``: the addresses of the function's branches to its start when known
    (the copier's analysis: a function as large as CPython's eval loop is not
    disassembled again at each of its copies)."""
    if sources is None:
        sources = [insn.address for insn in _branches_to(bytes(code), start, start)]
    if not sources:
        return True
    positions = sorted(set(copy.old_to_new.values()))
    out = bytearray(copy.code)
    for source in sources:
        at = copy.old_to_new.get(source)
        if at is None:
            return False
        i = bisect.bisect_right(positions, at)
        end = positions[i] if i < len(positions) else copy.address + copy.code_size
        piece = bytes(out[at - copy.address:end - copy.address])
        found = False
        for branch in _branches_to(piece, at, copy.address):
            displacement = rel32(branch.address + branch.size, start)
            if branch.imm_size != 4 or displacement is None:
                return False
            offset = branch.address - copy.address + branch.imm_offset
            out[offset:offset + 4] = displacement
            found = True
        if not found:
            return False
    copy.code = bytes(out)
    return True
