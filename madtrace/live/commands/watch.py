# SPDX-License-Identifier: GPL-2.0-or-later
"""watch VAR|ADDR"""

from __future__ import annotations

from ...errors import UsageError
from ..registry import Command, register
from .trace import data_tracing_state


@register
class Watch(Command):
    """Trace the loads and stores of one variable (a global or static, by name,
    its whole size) or of the 8 bytes at an address, while the target runs.
    `status` shows the faults; the accesses go to the trace directory as with
    `trace data on`, and `trace data off` ends the watch."""

    name = "watch"
    arguments = "VAR|ADDR"
    summary = "trace the accesses to one variable or address"
    min_args = 1
    max_args = 1
    json_form = True
    completes = "variables"
    stops_target = True

    def run(self, session, args):
        target = args[0]
        try:
            address, size, label = int(target, 0), 8, target
        except ValueError:
            variable = session.space.find_variable(target)
            address, size = variable.address, max(variable.variable.size, 1)
            label = variable.variable.name
        if address <= 0:
            raise UsageError(f"not an address: {target}")
        message = session.recording.start_data_tracing(
            only_regions=[_region(address, address + size, label)])
        return data_tracing_state(session, message)

    def render(self, data):
        return data["message"]


def _region(start: int, end: int, label: str):
    from ...data.regions import Region
    return Region(start, end, label)
