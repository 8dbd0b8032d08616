# SPDX-License-Identifier: GPL-2.0-or-later
"""quit"""

from __future__ import annotations

from ..registry import Command, register


@register
class Quit(Command):
    """Leave the REPL. When the REPL runs the session (repl PID, attach --repl,
    --repl -- CMD) this detaches like 'detach'; connected to a daemon
    (repl --connect PID) it disconnects and the daemon keeps tracing.
    Ctrl-D does the same."""

    name = "quit"
    aliases = ("exit",)
    summary = "leave the REPL (detach, or disconnect from a daemon)"
    side = "frontend"

    def run_frontend(self, frontend, args):
        frontend.quit()
        return None
