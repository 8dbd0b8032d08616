# SPDX-License-Identifier: GPL-2.0-or-later
"""top [N]"""

from __future__ import annotations

import time

from ...errors import UsageError
from ..registry import Command, register
from .calls import current_counts


@register
class Top(Command):
    """Live call counts: the N most called instrumented functions (default 10),
    with the calls since the previous 'top' and their rate per second."""

    name = "top"
    arguments = "[N]"
    summary = "most called functions, with calls per second since the last top"
    max_args = 1
    json_form = True

    def run(self, session, args):
        try:
            limit = int(args[0]) if args else 10
        except ValueError:
            raise UsageError(f"top: not a number: {args[0]!r}") from None
        counts = current_counts(session)
        now = time.monotonic()
        previous, then = session.scratch.get("top", ({}, session.scratch.get("start", now)))
        session.scratch["top"] = (counts, now)
        elapsed = max(now - then, 1e-9)
        rows = [{"function": name, "calls": n, "delta": n - previous.get(name, 0),
                 "per_second": round((n - previous.get(name, 0)) / elapsed, 1)}
                for name, n in counts.items()]
        rows.sort(key=lambda r: (-r["delta"], -r["calls"], r["function"]))
        return rows[:max(limit, 0)]

    def render(self, rows):
        if not rows:
            return "no function is instrumented (see: instrument GLOB)"
        lines = [f"{'calls':>12} {'new':>10} {'per s':>12}  function"]
        lines += [f"{r['calls']:>12} {r['delta']:>10} {r['per_second']:>12}  {r['function']}"
                  for r in rows]
        return "\n".join(lines)
