# SPDX-License-Identifier: GPL-2.0-or-later
"""status"""

from __future__ import annotations

from ..registry import Command, register


def _data_state(engine, inside: list[str]) -> str:
    if engine is None:
        return "off"
    state = "on" if engine.active else "off"
    where = f", only inside {', '.join(inside)}" if inside and engine.active else ""
    return f"{state} ({engine.faults} faults, {len(engine.protected)} pages{where})"


@register
class Status(Command):
    """The traced process: its threads, the instrumented functions and their
    patches, the records drained so far, how full each thread's ring is, and
    the events dropped (never silently)."""

    name = "status"
    summary = "threads, instrumented functions, patches, records, drops"
    json_form = True

    def run(self, session, args):
        engine = session.functions
        traced = session.traced_functions()
        patched = [fn for fn in traced if engine is not None and fn.fid in engine.patches_of]
        status = {
            "pid": session.pid,
            "command": session.recording.meta.get("command"),
            "output": session.recording.options.output,
            "threads": sorted(list(session.tracee.threads)),
            "functions_instrumented": len(patched),
            "functions_restored": len(traced) - len(patched),
            "patches": len(engine.patches) if engine is not None else 0,
            "records": 0, "dropped_events": 0, "ring_fill": {},
            "data_tracing": _data_state(session.recording.data, session.scratch.get("data_in", [])),
        }
        rings = engine.rings if engine is not None else None
        if rings is not None:
            rings.drain_all()
            totals = rings.totals()
            status["records"] = sum(rings.records_per_thread.values())
            status["dropped_events"] = totals["dropped"] + totals["unregistered_records"]
            for tid, fill in rings.fill().items():
                status["ring_fill"][str(tid)] = round(fill, 4)
        return status

    def render(self, s):
        threads = s["threads"]
        fill = max(s["ring_fill"].values(), default=0.0)
        return "\n".join([
            f"process {s['pid']}: {' '.join(s['command'] or [])}",
            f"threads       : {len(threads)} ({' '.join(map(str, threads[:16]))}"
            f"{' ...' if len(threads) > 16 else ''})",
            f"functions     : {s['functions_instrumented']} instrumented, "
            f"{s['functions_restored']} restored; {s['patches']} patched sites",
            f"records       : {s['records']} (rings at most {fill:.1%} full)",
            f"dropped events: {s['dropped_events']}",
            f"data tracing  : {s['data_tracing']}",
            f"trace dir     : {s['output']}",
        ])
