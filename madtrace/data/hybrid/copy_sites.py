# SPDX-License-Identifier: GPL-2.0-or-later
"""Function tracing's call-site patches, kept in step in the hybrid engine's copies.

A copy of a function (rewriting.py) is made from its code as it is then,
function tracing's call-site patches included (a ``call f`` that became a
``jmp`` to a trampoline).  A thread may run a copy for as long as it likes
(a loop entered by on-stack replacement, or returned into from a call), so
when function tracing patches a call site live (``instrument``) or takes a
patch out (``restore``, detach), the same instruction of every copy of the
function changes with it: ``call f`` <-> ``jmp trampoline``, each 5 bytes,
re-encoded for its place in the copy, written while every thread is
stopped.  Before, a function instrumented live was not counted when called
from a copy, and a restored one still was.

An instruction of a copy that is not what it should be (a copy made before
the site could be patched, an encoding the copier changed) is left as it
is and counted (``call sites not mirrored``).
"""

from __future__ import annotations

import struct

from ...arch.x86_64.encode import rel32

CALL, JMP = 0xE8, 0xE9


def _target(code: bytes, at: int) -> int:
    return at + 5 + struct.unpack_from("<i", code, 1)[0]


def mirror(rewriter, patches: list, on: bool) -> None:
    """``patches`` (function tracing's, at call and tail-call sites) were applied
    (``on``) or reverted in the original code: the same in every copy."""
    for patch in patches:
        if len(patch.original) != 5 or patch.original[0] not in (CALL, JMP) or \
                patch.patched[0] != JMP:
            continue
        bounds = rewriter.bounds(patch.address)
        state = rewriter.functions.get(bounds[1]) if bounds else None
        if state is None or not state.copies:
            continue
        callee = _target(patch.original, patch.address)
        trampoline = _target(patch.patched, patch.address)
        was, now = ((patch.original[0], callee), (JMP, trampoline)) if on else \
            ((JMP, trampoline), (patch.original[0], callee))
        for copy in state.copies:
            at = copy.old_to_new.get(patch.address)
            area = rewriter.area_of(at) if at is not None else None
            if at is None or area is None:
                continue
            local = getattr(area.area, "local", None)
            if local is None or local.closed:
                continue
            offset = at - area.area.address
            current = bytes(local[offset:offset + 5])
            displacement = rel32(at + 5, now[1])
            if current[0] != was[0] or _target(current, at) != was[1] or displacement is None:
                rewriter.stats["call sites not mirrored"] += 1
                continue
            local[offset:offset + 5] = bytes([now[0]]) + displacement
            if now[0] == CALL:       # the call returns to the original code once the copies go
                area.area.return_points[at + 5] = patch.address + 5
            rewriter.stats["call sites mirrored into copies"] += 1
