# SPDX-License-Identifier: GPL-2.0-or-later
"""watch VAR|ADDR"""

from __future__ import annotations

from ..registry import Command, register
from .trace import NOT_AVAILABLE, DataTracingUnavailable


@register
class Watch(Command):
    """Count the accesses to a variable or an address. Belongs to the data
    tracing engine, which the REPL cannot drive yet."""

    name = "watch"
    arguments = "VAR|ADDR"
    summary = f"watch a variable's accesses ({NOT_AVAILABLE})"
    min_args = 1
    max_args = 1
    completes = "symbols"

    def run(self, session, args):
        raise DataTracingUnavailable(NOT_AVAILABLE)
