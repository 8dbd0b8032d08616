# SPDX-License-Identifier: GPL-2.0-or-later
"""snapshot [DIR] [--force]"""

from __future__ import annotations

import os

from ...errors import UsageError
from ..registry import Command, register


@register
class Snapshot(Command):
    """A flight recorder's trigger by hand: write the window it holds (the last
    --flight SIZE or --keep SECONDS of the recording) as a trace directory, to
    DIR or to the next snapshot.N of the session's folder, while the target
    keeps running.  Without a flight recorder, DIR is required and the whole
    trace so far is written, as 'save DIR' does.  DIR must not exist
    (--force replaces an old trace directory)."""

    name = "snapshot"
    arguments = "[DIR]"
    summary = "write the flight recorder's window (or the trace so far) to a directory"
    min_args = 0
    max_args = 1
    json_form = True
    flags = ("--force",)
    completes = "paths"

    def localize(self, args):
        return [os.path.abspath(os.path.expanduser(a)) for a in args]

    def execute(self, session, invocation):
        recording = session.recording
        directory = invocation.args[0] if invocation.args else None
        force = "--force" in invocation.flags
        if recording.flight is not None:
            return recording.flight.snapshot("snapshot command", directory, force)
        if directory is None:
            raise UsageError(
                "no flight recorder in this session (--flight SIZE): name the "
                "directory, snapshot DIR (the whole trace so far, as save DIR)"
            )
        return recording.snapshot(directory, force=force)

    def render(self, d):
        flight = d.get("flight")
        what = f"the flight recorder's last {flight['seconds']:.2f} s" if flight else "the trace so far"
        return (
            f"wrote {what} to {d['directory']}: {d['records']} call records, "
            f"{d['accesses']} data accesses, {d['dropped_events']} dropped events"
        )
