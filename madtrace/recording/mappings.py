# SPDX-License-Identifier: GPL-2.0-or-later
"""What a recording maps in its process comes out again (part of recording.Recording).

* at attach, what an earlier, killed session left is found and taken out
  before anything is installed (target/leftovers.py), said in one line;
* at detach, once every patch is reverted and every stop handled, the areas
  madtrace mapped (its process's MadtraceAreas, target/mappings.py) are unmapped,
  also in each fork child's copy of the memory.

``CleanSlate`` is a mixin of ``recording.Recording``: it uses its tracee, meta,
functions engine and log.
"""

from __future__ import annotations

from ..data.hybrid.alias_leftovers import recover_aliases
from ..target.leftovers import recover
from ..process.tracee import Tracee


class CleanSlate:
    def _recover_leftovers(self) -> None:
        """What an earlier session (killed) left in the target is found and taken
        out before anything is installed (target/leftovers.py); said in one line
        (imported with this module: its first import took 3 of the ~5 ms a C
        program stood still at attach)."""
        found = recover(self.tracee, self.address_space, aliases=recover_aliases)
        if not found:
            return
        self.leftovers_line = found.line(self.tracee.pid)
        self.log(self.leftovers_line)
        release = found.release
        self.meta["leftovers"] = {
            "sites_restored": [{"address": a, "module": m} for a, m in found.sites],
            "areas": found.areas, "unmapped": len(release.unmapped),
            "bytes_unmapped": sum(n for _, n in release.unmapped),
            "returns_given_back": release.returns, "guard": found.guard,
            "kept": [{"area": n, "bytes": b, "why": w} for n, b, w in found.held + release.kept]}

    def _release_areas(self, tracee: Tracee) -> None:
        """At detach (every thread stopped, every patch reverted): madtrace's
        mappings out of the target (target/mappings.py), said in one line."""
        if tracee.madtrace_areas is None:
            return
        result = tracee.madtrace_areas.release(tracee)
        if result.unmapped or result.kept:
            self.log(result.line(tracee.pid))
        released = self.meta.setdefault("released", {"unmapped": 0, "bytes": 0, "kept": []})
        released["unmapped"] += len(result.unmapped)
        released["bytes"] += sum(n for _, n in result.unmapped)
        released["returns_given_back"] = released.get("returns_given_back", 0) + result.returns
        released["kept"] += [{"area": name, "bytes": n, "why": why} for name, n, why in result.kept]
        if result.ended:
            released["ended_with_the_process"] = [{"area": n, "bytes": b} for n, b in result.ended]

    def _release_in_child(self, parent: Tracee, child: Tracee) -> None:
        """A fork child, after every engine undid its part there: madtrace's
        mappings out of the child's copy of the memory."""
        if parent.madtrace_areas is None or not parent.madtrace_areas.areas:
            return
        result = parent.madtrace_areas.release(child, copy=True)
        if self.functions is not None:
            self.functions.child_released(child, result.kept)
