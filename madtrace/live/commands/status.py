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


def _pool_line(pool: dict) -> str:
    if not pool.get("on"):
        return f"traced from their creation ({pool.get('why_off') or 'ring pool off'})"
    return (f"not traced, take a ring from the pool ({pool['claimed']} taken, "
            f"{pool['taken_back']} given back at their end, pool found empty "
            f"{pool['found_empty']} times, {pool['seized_before_fork_or_exec']} traced before a "
            f"fork or an exec, {pool.get('growth_stops', 0)} stops to map more rings)")


@register
class Status(Command):
    """The traced process: its threads, the instrumented functions and their
    patches, the records drained so far, how full each thread's ring is (now,
    and at its fullest since the last status), the records that waited for
    room, and the events dropped (never silently)."""

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
            # patched sites of functions (the ring pool's hooks of fork and exec aside)
            "patches": len(engine.patches) - len(engine.threads.hooks) if engine is not None else 0,
            "records": 0, "dropped_events": 0, "ring_fill": {}, "ring_peak": {}, "ring_waits": 0,
            "data_tracing": _data_state(session.recording.data, session.scratch.get("data_in", [])),
            # the longest stop of the last command batch, and each of its stops
            "last_pause_ms": round(session.last_pause * 1000, 3),
            "last_stops_ms": [round(s * 1000, 3) for s in session.last_stops],
            # when the target was stopped: the attach, then the last commands' stops,
            # [start, end] in s of CLOCK_MONOTONIC (the clock of the target's own timing)
            "stop_windows": [list(w) for w in ([session.controller.attach_window]
                                               if session.controller.attach_window else [])
                             + list(session.stop_windows)],
            # how long the attach kept the target stopped (seize to resume; None: launched)
            "attach_pause_ms": None if session.controller.attach_pause is None
            else round(session.controller.attach_pause * 1000, 3),
            "tracer_events": session.controller.events_handled,
        }
        data = session.recording.data
        if data is not None:
            counts = data.live_counts()
            status.update(accesses=counts["accesses"], accesses_on_faults=counts["on_faults"],
                          functions_relocated=counts["relocated"])
        rings = engine.rings if engine is not None else None
        if rings is not None:
            status["ring_peak"] = {str(t): round(f, 4) for t, f in rings.take_peaks().items()}
            rings.drain_all()
            totals = rings.totals()
            status["records"] = sum(rings.records_per_thread.values())
            status["dropped_events"] = totals["dropped"] + totals["unregistered_records"]
            status["ring_waits"] = totals["ring_waits"]
            for tid, fill in rings.fill().items():
                status["ring_fill"][str(tid)] = round(fill, 4)
        # after the drain: it adopts the rings claimed so far and reads the owners of
        # those taken over (before it, a drain thread behind made claimed +
        # taken_over fall short of the threads that took a ring: 1 + 127 of 301)
        status["ring_pool"] = engine.threads.summary() if engine is not None else \
            {"on": False, "why_off": "no function is traced"}
        return status

    def render(self, s):
        threads = s["threads"]
        fill = max(s["ring_fill"].values(), default=0.0)
        peak = max(s.get("ring_peak", {}).values(), default=0.0)
        return "\n".join([
            f"process {s['pid']}: {' '.join(s['command'] or [])}",
            f"threads       : {len(threads)} ({' '.join(map(str, threads[:16]))}"
            f"{' ...' if len(threads) > 16 else ''})",
            f"functions     : {s['functions_instrumented']} instrumented, "
            f"{s['functions_restored']} restored; {s['patches']} patched sites",
            f"records       : {s['records']} (rings {fill:.1%} full now, at most {peak:.1%} "
            f"since the last status; {s.get('ring_waits', 0)} records waited for room)",
            f"dropped events: {s['dropped_events']}",
            f"new threads   : {_pool_line(s.get('ring_pool') or {})}",
            f"data tracing  : {s['data_tracing']}"
            + (f"; {s['accesses']} accesses ({s['accesses_on_faults']} on faults), "
               f"{s['functions_relocated']} functions relocated" if "accesses" in s else ""),
            f"trace dir     : {s['output']}",
        ])
