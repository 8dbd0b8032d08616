# SPDX-License-Identifier: GPL-2.0-or-later
"""top [N]"""

from __future__ import annotations

import time
from collections import Counter

from ...errors import UsageError
from ..registry import Command, register
from .calls import current_counts


def current_accesses(session) -> dict[str, int]:
    """Data accesses recorded so far, per function of the accessing instruction."""
    engine = session.recording.data
    if engine is None:
        return {}
    per_function: Counter = Counter()
    for (rip, _kind), n in engine.count_items():
        per_function[session.space.code_location(rip).rsplit("+", 1)[0]] += n
    return dict(per_function)


def ranked(counts: dict[str, int], previous: dict[str, int], elapsed: float, limit: int) -> list:
    rows = [{"function": name, "count": n, "delta": n - previous.get(name, 0),
             "per_second": round((n - previous.get(name, 0)) / elapsed, 1)}
            for name, n in counts.items()]
    rows.sort(key=lambda r: (-r["delta"], -r["count"], r["function"]))
    return rows[:limit]


@register
class Top(Command):
    """Live counts: the N instrumented functions (default 10) with the most
    calls since the previous 'top', with their total and their rate per second;
    while data tracing is or was on, the same for the data accesses made by
    each function."""

    name = "top"
    arguments = "[N]"
    summary = "most called functions and most accessing functions, with rates"
    max_args = 1
    json_form = True

    def check(self, args):
        if args:
            try:
                if int(args[0]) < 1:
                    raise ValueError
            except ValueError:
                raise UsageError(f"top: not a positive number: {args[0]!r}") from None

    def run(self, session, args):
        limit = int(args[0]) if args else 10
        counts = {"calls": current_counts(session), "accesses": current_accesses(session)}
        now = time.monotonic()
        previous, then = session.scratch.get("top", ({}, session.scratch.get("start", now)))
        session.scratch["top"] = (counts, now)
        elapsed = max(now - then, 1e-9)
        return {what: ranked(counts[what], previous.get(what, {}), elapsed, limit)
                for what in ("calls", "accesses")}

    def render(self, data):
        if not data["calls"] and not data["accesses"]:
            return "no function is instrumented and no data is traced (see: instrument GLOB)"
        lines = []
        for what in ("calls", "accesses"):
            if data[what]:
                lines.append(f"{what:>12} {'new':>10} {'per s':>12}  function")
                lines += [f"{r['count']:>12} {r['delta']:>10} {r['per_second']:>12}  {r['function']}"
                          for r in data[what]]
        return "\n".join(lines)
