# SPDX-License-Identifier: GPL-2.0-or-later
"""trace data on|off"""

from __future__ import annotations

from ...errors import UsageError
from ..registry import Command, register

NOT_AVAILABLE = "not available yet"


class DataTracingUnavailable(UsageError):
    pass


@register
class Trace(Command):
    """Turn data-access tracing on or off while the target runs: every load and
    store to .data, .bss and the brk heap is recorded (madtrace record --data).
    Restricting it to regions or to the inside of a function is not available yet."""

    name = "trace"
    arguments = "data on|off"
    summary = "turn data-access tracing on or off"
    min_args = 2
    max_args = 2
    stops_target = True

    def run(self, session, args):
        what, switch = args
        if what != "data" or switch not in ("on", "off"):
            raise UsageError("usage: trace data on|off")
        recording = session.recording
        return recording.start_data_tracing() if switch == "on" else recording.stop_data_tracing()
