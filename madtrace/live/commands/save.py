# SPDX-License-Identifier: GPL-2.0-or-later
"""save DIR [--force]"""

from __future__ import annotations

import os

from ..registry import Command, register


@register
class Save(Command):
    """Write the trace directory of the session so far to DIR while the target
    keeps running: what 'detach' (or 'madtrace ctl PID stop') writes at the
    end, with the calls and data accesses recorded until now, outcome
    "snapshot" and the memory map of now.  `madtrace summary DIR`, report and
    export read it.  DIR must not exist (--force replaces an old trace
    directory); it cannot be the session's own trace directory.  A relative
    DIR is relative to where you typed it, also with a daemon."""

    name = "save"
    arguments = "DIR"
    summary = "write the trace so far to DIR (the target keeps running)"
    min_args = 1
    max_args = 1
    json_form = True
    flags = ("--force",)
    completes = "paths"

    def localize(self, args):
        return [os.path.abspath(os.path.expanduser(args[0]))]

    def execute(self, session, invocation):
        return session.recording.snapshot(os.path.expanduser(invocation.args[0]),
                                          force="--force" in invocation.flags)

    def render(self, d):
        calls = sum(d["calls"].values())
        return (f"saved the trace so far to {d['directory']}: {calls} calls of "
                f"{len(d['calls'])} functions ({d['records']} records), {d['accesses']} data "
                f"accesses, {d['dropped_events']} dropped events")
