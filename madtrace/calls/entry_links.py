# SPDX-License-Identifier: GPL-2.0-or-later
"""Where function tracing's trampolines go on to: the original code, or the
data engine's copy of it.

Function tracing's entry trampoline (engine.py) writes the entry record and
then jumps through an 8-byte slot of its own (``jmp [rip + slot]``).  The
slot holds one of two addresses:

* the *fallback*: the function's first instructions, relocated right after
  the slot, which jump back into the function's body (function tracing
  alone, or a function the data engine has not moved);
* the start of a *copy* of the whole function made by the hybrid data
  engine (data/hybrid/rewriting.py): its probes record the accesses of the call
  inside the target, with no fault.  The copy is made from the function's
  own bytes (function tracing's patch undone), so it begins with the
  function's own first instructions.

A slot is written with one aligned 8-byte store through the tracer's mapping
of the code area, so a thread jumping through it sees the old or the new
address, never a mix; a newer copy of the function takes over the same way.
The entry record comes first in either case, so the order of call records
and access records is the program's.

Call-site trampolines (a ``call f`` patched to jump to one) return the same
way: after the exit record, through a slot holding the site's return
address, or its equivalent in the copy of the calling function once there is
one, so that a loop calling a traced function keeps running its copy (before,
every such call returned into the original code, which faulted at its next
traced access and was moved back into the copy by a ptrace stop).

Function tracing's call-site patches are mirrored into the copies
(``applied``, ``reverted``: the rewriter's ``mirror``), so that a function
instrumented or restored live is counted, or not, whether its caller runs
its original code or a copy (before, calls made from a copy went uncounted
after a live ``instrument``, and were still counted after ``restore``).

``EntryLinks`` is shared by the two engines of one image (the session makes
it): function tracing ``add``s the slot of each entry trampoline it writes
and registers its patch set (``patched``, ``original``: what covers a
function's first bytes); the rewriter ``point``s a function's slots at its
latest copy (``point_returns``: the return slots of the call sites in it)
and ``reset``s them all when data tracing stops (the copies may go then).  A trampoline written for a function that already has a copy is
pointed at it at once (a function instrumented live after it was moved);
before that, the rewriter takes its own entry jump out (``step_aside``), so
that function tracing patches and relocates the function's own bytes.
"""

from __future__ import annotations

import bisect
import ctypes
from typing import Callable

from ..target.patchset import PatchSet


class _Slot:
    __slots__ = ("area", "address", "fallback", "moved")

    def __init__(self, area, address: int, fallback: int, moved: dict[int, int]):
        self.area = area          # the code area (SharedArea) the slot is in
        self.address = address    # 8-byte aligned
        self.fallback = fallback  # the relocated first instructions
        self.moved = moved        # original instruction -> its relocated copy after the slot

    def write(self, value: int) -> None:
        local = getattr(self.area, "local", None)
        if local is None or local.closed:
            return                # the area is gone with its trampolines
        offset = self.address - self.area.address
        ctypes.c_uint64.from_buffer(local, offset).value = value


class EntryLinks:
    def __init__(self):
        self._slots: dict[int, list[_Slot]] = {}      # function start -> its trampolines' slots
        self._copies: dict[int, int] = {}             # function start -> start of its copy
        self._returns: dict[int, list[_Slot]] = {}    # call site's return address -> slots
        self._return_keys: list[int] | None = []      # sorted keys of _returns (None: stale)
        # the rewriter's: an original instruction's address in its function's latest copy
        self.copy_address: Callable[[int], int | None] | None = None
        # the rewriter's: function tracing's call-site patches applied (True) or
        # reverted (False) in the original code: the same in every copy
        self.mirror: Callable[[list, bool], None] | None = None
        self._patch_sets: list[PatchSet] = []         # function tracing's
        # the rewriter's: take its own jump at a function's entry out (start -> None)
        self.step_aside: Callable[[int], None] | None = None
        self.linked = 0                               # slots pointed at a copy, in all

    # ------------------------------------------------------- function tracing
    def watch(self, patches: PatchSet) -> None:
        """Function tracing's patch set: what ``patched`` and ``original`` see."""
        if patches not in self._patch_sets:
            self._patch_sets.append(patches)

    def add(self, start: int, area, slot: int, moved: list[tuple[int, int, int]]) -> None:
        """The slot of an entry trampoline of the function at ``start``, written
        with its fallback; ``moved``: (relocated address, original address, size)
        of the first instructions after it (relocate.py).  Pointed at the
        function's copy at once if it has one."""
        entry = _Slot(area, slot, moved[0][0], {original: new for new, original, _ in moved})
        self._slots.setdefault(start, []).append(entry)
        copy = self._copies.get(start)
        if copy is not None:
            entry.write(copy)
            self.linked += 1

    def add_return(self, back: int, area, slot: int) -> None:
        """The return slot of a call-site trampoline whose site returns to ``back``
        (the slot holds ``back``); pointed into the calling function's copy at
        once if it has one."""
        entry = _Slot(area, slot, back, {})
        self._returns.setdefault(back, []).append(entry)
        self._return_keys = None
        target = self.copy_address(back) if self.copy_address is not None else None
        if target is not None:
            entry.write(target)

    def applied(self, patches: list) -> None:
        """Function tracing applied ``patches`` (every thread stopped)."""
        sites = [p for p in patches if p.address not in self._slots]   # not the entry patches
        if sites and self.mirror is not None:
            self.mirror(sites, True)

    def reverted(self, patches: list) -> None:
        """Function tracing reverted ``patches`` (every thread stopped)."""
        sites = [p for p in patches if p.address not in self._slots]
        if sites and self.mirror is not None:
            self.mirror(sites, False)

    def before_patching(self, start: int) -> None:
        """Function tracing is about to patch the entry at ``start``."""
        if self.step_aside is not None:
            self.step_aside(start)

    def forget_range(self, lo: int, hi: int) -> None:
        """A module was unmapped: its functions' trampolines are unreachable."""
        for start in [s for s in self._slots if lo <= s < hi]:
            del self._slots[start]
        for start in [s for s in self._copies if lo <= s < hi]:
            del self._copies[start]
        for back in [b for b in self._returns if lo <= b < hi]:
            del self._returns[back]
        self._return_keys = None

    # ----------------------------------------------------------- the rewriter
    def point(self, start: int, copy: int) -> int:
        """Calls through the entry trampolines of ``start`` go to ``copy`` from now
        on (also those written later); returns how many trampolines there are."""
        self._copies[start] = copy
        slots = self._slots.get(start, ())
        for entry in slots:
            entry.write(copy)
        self.linked += len(slots)
        return len(slots)

    def point_returns(self, lo: int, hi: int, old_to_new: dict[int, int]) -> int:
        """The return slots of the call sites in [lo, hi) (a function) go to
        their equivalent in its copy (``old_to_new``); returns how many."""
        if self._return_keys is None:
            self._return_keys = sorted(self._returns)
        keys = self._return_keys
        pointed = 0
        for i in range(bisect.bisect_left(keys, lo), bisect.bisect_left(keys, hi)):
            target = old_to_new.get(keys[i])
            if target is not None:
                for entry in self._returns[keys[i]]:
                    entry.write(target)
                    pointed += 1
        return pointed

    def unpoint(self, start: int) -> None:
        """The function's copy may not be entered at its start any more."""
        self._copies.pop(start, None)
        for entry in self._slots.get(start, ()):
            entry.write(entry.fallback)

    def reset(self) -> None:
        """Every slot back to its fallback (data tracing stops; every thread stopped)."""
        for start in list(self._copies):
            self.unpoint(start)
        for slots in self._returns.values():
            for entry in slots:
                entry.write(entry.fallback)

    @property
    def watching(self) -> bool:
        """Function tracing's patches are known here (it runs in this image)."""
        return bool(self._patch_sets)

    def traced(self, start: int) -> bool:
        """Calls of the function at ``start`` go through an entry trampoline now."""
        return any(start in patches.applied and start in self._slots
                   for patches in self._patch_sets)

    def resume_at(self, address: int) -> int:
        """Where a thread taken out of a copy at the original instruction
        ``address`` resumes: ``address``, unless function tracing's entry patch
        covers it; then that instruction relocated in the trampoline, after the
        entry record (resuming at the entry would record the call again)."""
        for start, _original in self.original(address, address + 1):
            slots = self._slots.get(start)
            if slots and address in slots[-1].moved:
                return slots[-1].moved[address]
        return address

    def patched(self, lo: int, hi: int) -> bool:
        """A patch of function tracing covers a byte of [lo, hi)."""
        return any(patches.covering(lo, hi) for patches in self._patch_sets)

    def original(self, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """(address, original bytes) of function tracing's patches covering [lo, hi)."""
        return [(p.address, p.original) for patches in self._patch_sets
                for p in patches.covering(lo, hi)]
