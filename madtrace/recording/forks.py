# SPDX-License-Identifier: GPL-2.0-or-later
"""--follow-forks: every fork child is traced like the parent.

A fork child starts as a copy of its parent, madtrace's patches, rings and
protections included.  The parent's engines first undo all of it in the
child (``on_fork_child``: as for a child that is not followed); then the
child gets a recording of its own, with fresh engines, in DIR/fork.<pid>/ (a
whole trace directory: its calls, its accesses, its images if it execs),
started before the child runs its first instruction.  So every call and
access each process makes is recorded once, in its own directory; what a
child inherited (its parent's calls before the fork) stays the parent's.
DIR/meta.json lists the processes followed (``processes``); a child of a
child lands in DIR/fork.<pid>/ too (``parent`` tells whose).  vfork children
share their parent's memory until they exec: they are followed from then on
like any image (their first image has no trace of its own).
"""

from __future__ import annotations

import dataclasses
import os

from ..process.tracee import Tracee
from .images import image_entry
from ..trace.format import fork_dir


class ForkChildren:
    def __init__(self, root):
        """``root``: the Recording of the process madtrace launched or attached."""
        self.root = root
        self.live: dict[int, object] = {}        # pid -> Recording of a child still running
        self.ended: list[dict] = []              # entries of children that ended
        root.controller.on_follow.append(self.follow)
        root.controller.on_child_exit.append(self.exited)

    def follow(self, child: Tracee) -> None:
        directory = fork_dir(self.root.options.output, child.pid)
        options = dataclasses.replace(self.root.options, output=directory, force=False, store=False,
                                      duration=None, quiet=True)
        recording = type(self.root)(options)     # a child is recorded as its root is
        recording.start_in_child(child, self.root.controller)
        self.live[child.pid] = recording

    def exited(self, child: Tracee) -> None:
        recording = self.live.pop(child.pid, None)
        if recording is not None:
            recording.finish("exited")
            self.ended.append(self._entry(recording))

    def finish(self, outcome: str) -> list[dict]:
        """The root recording ends (detach, or the main target exited first): the
        children still traced end too.  Returns DIR/meta.json's ``processes``."""
        for pid, recording in list(self.live.items()):
            recording.finish(outcome)
            self.ended.append(self._entry(recording))
        self.live.clear()
        return sorted(self.ended, key=lambda e: e["pid"])

    def _entry(self, recording) -> dict:
        entry = image_entry(os.path.relpath(recording.options.output, self.root.options.output),
                            recording.meta)
        entry.update(pid=recording.tracee.pid, parent=recording.meta.get("parent"),
                     exit_status=recording.meta.get("exit_status"))
        return entry
