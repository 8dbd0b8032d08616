# SPDX-License-Identifier: GPL-2.0-or-later
"""trace data on [REGION-GLOB...] | trace data off"""

from __future__ import annotations

import fnmatch

from ...errors import UsageError
from ..registry import Command, register

NOT_AVAILABLE = "not available yet"


class DataTracingUnavailable(UsageError):
    pass


@register
class Trace(Command):
    """Turn data-access tracing on or off while the target runs: every load and
    store to the traced regions is recorded (as madtrace record --data).  With
    globs, only the regions whose label matches: `trace data on '.bss of prog'
    '[heap]'`.  Tracing only inside a function is not available yet."""

    name = "trace"
    arguments = "data on [REGION-GLOB...] | data off"
    summary = "turn data-access tracing on (for some regions) or off"
    min_args = 2
    max_args = None
    stops_target = True

    def run(self, session, args):
        what, switch, globs = args[0], args[1], args[2:]
        if what != "data" or switch not in ("on", "off") or (switch == "off" and globs):
            raise UsageError("usage: trace data on [REGION-GLOB...] | trace data off")
        recording = session.recording
        if switch == "off":
            return recording.stop_data_tracing()
        if not globs:
            return recording.start_data_tracing()
        if "in" in globs:
            raise DataTracingUnavailable(f"trace data in FUNC is {NOT_AVAILABLE}")
        return recording.start_data_tracing(
            region_filter=lambda region: any(fnmatch.fnmatchcase(region.label, g) for g in globs))
