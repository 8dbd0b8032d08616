# SPDX-License-Identifier: GPL-2.0-or-later
"""calls [--json]"""

from __future__ import annotations

from ..registry import Command, register


def current_counts(session) -> dict[str, int]:
    """Completed-call counts of every function instrumented so far (rings drained now)."""
    engine = session.functions
    if engine is None:
        return {}
    if engine.rings is not None:
        engine.rings.drain_all()
    return engine.call_counts()


@register
class Calls(Command):
    """Print the number of calls counted for each function instrumented so far
    (restored functions keep their count), most called first."""

    name = "calls"
    summary = "call counts of the instrumented functions"
    json_form = True

    def run(self, session, args):
        return current_counts(session)

    def render(self, counts):
        if not counts:
            return "no function is instrumented (see: instrument GLOB)"
        ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return "\n".join(f"{n:>12}  {name}" for name, n in ordered)
