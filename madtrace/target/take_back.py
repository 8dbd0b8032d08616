# SPDX-License-Identifier: GPL-2.0-or-later
"""Undoing a change of the target made in several steps, when a later step fails.

``TakeBack(tracee)`` notes where the process's areas end (mappings.py
``mark``); ``add(undo)`` registers what takes one step back (``undo(rs)``,
given a RemoteSyscalls scope), before the step when it can also undo a half-done
one; ``run()`` runs them newest first (one that fails too is reported, and the
others still run), then takes out the areas mapped since the mark.  Returns
what it has to say (lines for the user).  Every thread of the target is
stopped meanwhile (a live command's stop, or the launch's).
"""

from __future__ import annotations

from .mappings import MadtraceAreas
from ..process.remote_syscall import RemoteSyscalls


class TakeBack:
    def __init__(self, tracee, what: str):
        self.tracee = tracee
        self.what = what                # said if an undo fails: "data tracing's set-up"
        self.madtrace_areas = MadtraceAreas.of(tracee)
        self.mark = self.madtrace_areas.mark()
        self.steps: list = []

    def add(self, undo) -> None:
        self.steps.append(undo)

    def run(self) -> list[str]:
        said: list[str] = []
        if not self.tracee.threads:     # the process is gone, and its memory with it
            return said
        with RemoteSyscalls(self.tracee) as rs:
            for undo in reversed(self.steps):
                try:
                    undo(rs)
                except Exception as exc:     # noqa: BLE001 - the rest must still run
                    said.append(f"undoing {self.what}: {exc}")
        release = self.madtrace_areas.release(self.tracee, since=self.mark)
        if release.kept:
            said.append(release.line(self.tracee.pid))
        return said
