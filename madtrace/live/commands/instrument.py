# SPDX-License-Identifier: GPL-2.0-or-later
"""instrument GLOB..."""

from __future__ import annotations

from ..registry import Command, register


@register
class Instrument(Command):
    """Start counting the calls of the functions matching GLOB (main executable;
    'libc.so.6:mem*' for a library). The target is stopped while its code is
    patched, then resumes. Functions already instrumented stay as they are;
    restored ones are instrumented again and their counts go on.  Attached, the
    trampolines are written while the target runs (calls/staging.py)."""

    name = "instrument"
    arguments = "GLOB..."
    summary = "instrument functions: count their calls from now on"
    min_args = 1
    max_args = None
    json_form = True
    stops_target = True
    stops_ahead = True
    completes = "functions"

    def prepare(self, session, args):
        session.recording.prepare_functions(
            list(args), stop_for=session.stop_for if session.alone else None)

    def run(self, session, args):
        return session.recording.add_functions(list(args))

    def render(self, report):
        patched = report["patched"]
        methods = {m: sum(1 for p in patched if p["method"] == m) for m in ("callsite", "entry")}
        sites = sum(p["sites"] for p in patched)
        lines = [f"instrumented {len(patched)} function{'s' if len(patched) != 1 else ''} "
                 f"({methods['callsite']} at their call sites, {methods['entry']} at their entry; "
                 f"{sites} patches)"]
        if len(patched) <= 10:
            lines += [f"  {p['function']} ({p['method']}, {p['sites']} sites)" for p in patched]
        lines += [f"  not instrumented: {s['what']}: {s['why']}" for s in report["skipped"][:10]]
        lines += [f"  inexact: {s['what']}: {s['why']}" for s in report["inexact"][:10]]
        return "\n".join(lines)
