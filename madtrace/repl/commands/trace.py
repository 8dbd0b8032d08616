# SPDX-License-Identifier: GPL-2.0-or-later
"""trace data on|off [REGIONS | in FUNC]"""

from __future__ import annotations

from ...errors import UsageError
from ..registry import Command, register

NOT_AVAILABLE = "data tracing is not available yet"


class DataTracingUnavailable(UsageError):
    pass


@register
class Trace(Command):
    """Turn data-access tracing on or off, for regions or inside a function.
    Belongs to the data tracing engine, which the REPL cannot drive yet."""

    name = "trace"
    arguments = "data on|off [REGIONS | in FUNC]"
    summary = f"data-access tracing ({NOT_AVAILABLE})"
    min_args = 2
    max_args = None

    def run(self, session, args):
        raise DataTracingUnavailable(NOT_AVAILABLE)
