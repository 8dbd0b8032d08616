# SPDX-License-Identifier: GPL-2.0-or-later
"""detach"""

from __future__ import annotations

from ..registry import WAIT_FOR_END, Command, register


@register
class Detach(Command):
    """Restore every instrumented function, detach from every thread and write
    the trace directory; the target keeps running as if never traced. Ends
    the session (and the daemon, for 'madtrace ctl PID stop')."""

    name = "detach"
    aliases = ("stop",)
    summary = "restore everything, detach (the target keeps running), write the trace"

    def run(self, session, args):
        session.request_stop(f"{'ctl' if session.scratch.get('daemon') else 'repl'} detach")
        return WAIT_FOR_END
