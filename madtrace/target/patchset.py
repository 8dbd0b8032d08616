"""Code patches in the target, applied and reverted transactionally.

A ``Patch`` replaces exactly ``len(original)`` bytes at ``address`` (no
word-sized read-modify-write, pitfall 9).  ``PatchSet.apply`` needs every
thread stopped; it checks that the bytes in the target are still the
original ones and that no thread is stopped strictly inside a patched range
(its next instruction would be cut in half), writes all patches or none,
and remembers them; ``revert`` writes the originals back wherever the
patched bytes are still in place.  Every patch the target carries is in
exactly one PatchSet, so detach, errors and signals can always undo them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..errors import TracerInternalError
from ..process.events import SignalStop, TrapStop
from ..process.memory import ProcessMemory
from .mappings import step_until_out


@dataclass(frozen=True)
class Patch:
    address: int
    original: bytes
    patched: bytes
    owner: str          # what it is for: "callsite f@caller+0x12", "entry f"...

    @property
    def end(self) -> int:
        return self.address + len(self.original)


class PatchConflict(TracerInternalError):
    pass


class PatchSet:
    def __init__(self):
        self.applied: dict[int, Patch] = {}
        self.longest = 0        # bytes of the longest patch ever applied (``covering``)
        # every address ever applied, sorted (``covering`` of a wide range); some may be
        # gone from ``applied`` since (its owners delete and clear it as well)
        self._starts: list[int] = []
        self._listed: set[int] = set()

    def __len__(self) -> int:
        return len(self.applied)

    def apply(self, mem: ProcessMemory, patches: list[Patch], thread_rips: list[int]) -> None:
        for p in patches:
            if len(p.original) != len(p.patched):
                raise PatchConflict(f"{p.owner}: patch and original differ in length")
            if p.address in self.applied:
                raise PatchConflict(f"{p.owner}: {p.address:#x} is already patched")
            for rip in thread_rips:
                if p.address < rip < p.end:
                    raise PatchConflict(f"{p.owner}: a thread is stopped inside the patched bytes")
            current = mem.read(p.address, len(p.original))
            if current != p.original:
                raise PatchConflict(f"{p.owner}: code at {p.address:#x} is not what was analysed")
        written: list[Patch] = []
        try:
            for p in patches:
                mem.write(p.address, p.patched)
                written.append(p)
        except BaseException:
            for p in written:
                mem.write(p.address, p.original)
            raise
        for p in patches:
            self.applied[p.address] = p
            self.longest = max(self.longest, len(p.original))
            if p.address not in self._listed:
                self._listed.add(p.address)
                bisect.insort(self._starts, p.address)
        if len(self._starts) > 2 * len(self.applied) + 256:
            self._starts = sorted(self.applied)
            self._listed = set(self._starts)

    def covering(self, lo: int, hi: int) -> list[Patch]:
        """The applied patches with a byte in [lo, hi), in address order: a few
        dictionary lookups for a short range (as many as the longest patch has
        bytes, plus hi - lo), a binary search in the sorted addresses for a
        wide one (a whole function), never a walk of every patch."""
        applied = self.applied
        if not applied:
            return []
        out = []
        first = lo - self.longest + 1
        if hi - first <= 64:
            addresses: range | list[int] = range(first, hi)
        else:
            starts = self._starts
            addresses = starts[bisect.bisect_left(starts, first):bisect.bisect_left(starts, hi)]
        for address in addresses:
            patch = applied.get(address)
            if patch is not None and patch.end > lo:
                out.append(patch)
        return out

    def revert(self, mem: ProcessMemory, addresses=None) -> int:
        """Restore the original bytes (of ``addresses``, default all). Returns how many."""
        targets = list(self.applied) if addresses is None else [a for a in addresses if a in self.applied]
        restored = 0
        for address in targets:
            p = self.applied[address]
            if mem.read(p.address, len(p.patched)) == p.patched:
                mem.write(p.address, p.original)
                restored += 1
            del self.applied[address]
        return restored

    def revert_copy(self, mem: ProcessMemory) -> int:
        """Restore originals in another address space holding a copy of ours (a
        fork child), keeping our own bookkeeping."""
        restored = 0
        for p in self.applied.values():
            if mem.read(p.address, len(p.patched)) == p.patched:
                mem.write(p.address, p.original)
                restored += 1
        return restored


def step_out_of(tracee, patches: list[Patch], rips: list[int]) -> list[int]:
    """A thread stopped strictly inside bytes about to be patched (the second
    instruction of a prologue, caught there by the stop) is single-stepped
    until it is out, so the function is patched rather than skipped; a thread
    inside a system call is left alone (PatchSet refuses).  Returns the
    threads' instruction pointers as they are now (``rips``: as they were)."""
    inside = _Inside(patches)
    if not any(inside.contains(rip) for rip in rips):
        return rips
    for tid, state in list(tracee.threads.items()):
        if state.running or state.gone or not isinstance(state.last_event, (TrapStop, SignalStop)):
            continue
        regs = tracee.get_regs(tid)
        if inside.contains(regs.rip) and regs.orig_rax == 2 ** 64 - 1:
            step_until_out(tracee, tid, inside)
    return [tracee.get_regs(tid).rip for tid in tracee.threads]


class _Inside:
    """The bytes of some patches, their first byte excluded: a thread there would
    resume in the middle of a patched instruction."""

    def __init__(self, patches: list[Patch]):
        self.spans = [(p.address, p.end) for p in patches]

    def contains(self, address: int) -> bool:
        return any(lo < address < hi for lo, hi in self.spans)
