# SPDX-License-Identifier: GPL-2.0-or-later
"""kill"""

from __future__ import annotations

import os
import signal

from ..registry import WAIT_FOR_END, Command, register


@register
class Kill(Command):
    """Kill the target with SIGKILL; the session ends when it is gone and the
    trace directory is written."""

    name = "kill"
    summary = "kill the target (SIGKILL) and end the session"

    def run(self, session, args):
        try:
            os.kill(session.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return WAIT_FOR_END
