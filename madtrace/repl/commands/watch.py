# SPDX-License-Identifier: GPL-2.0-or-later
"""watch VAR|ADDR"""

from __future__ import annotations

from ..registry import Command, register
from .trace import NOT_AVAILABLE, DataTracingUnavailable


@register
class Watch(Command):
    """Count the accesses to a variable or an address. Restricting data tracing
    to one variable is not available yet (use `trace data on`)."""

    name = "watch"
    arguments = "VAR|ADDR"
    summary = f"watch one variable's accesses ({NOT_AVAILABLE})"
    min_args = 1
    max_args = 1
    completes = "symbols"

    def run(self, session, args):
        raise DataTracingUnavailable(f"watch is {NOT_AVAILABLE}: use `trace data on`")
