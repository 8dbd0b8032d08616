# SPDX-License-Identifier: GPL-2.0-or-later
"""sleep SECONDS"""

from __future__ import annotations

from ...errors import UsageError
from ..registry import Command, register

LONGEST = 3600.0


@register
class Sleep(Command):
    """Wait SECONDS (a decimal number) while the target runs: useful in batch
    files between 'instrument' and 'calls'.  Ctrl-C cuts it short (the session
    goes on)."""

    name = "sleep"
    arguments = "SECONDS"
    summary = "let the target run for a while"
    min_args = 1
    max_args = 1
    side = "frontend"

    def run_frontend(self, frontend, args):
        try:
            seconds = float(args[0])
        except ValueError:
            raise UsageError(f"sleep: not a number of seconds: {args[0]!r}") from None
        if not 0 <= seconds <= LONGEST:
            raise UsageError(f"sleep: seconds must be between 0 and {LONGEST:g}")
        if frontend.interrupted.wait(seconds):
            raise UsageError("sleep: interrupted")
        return None
