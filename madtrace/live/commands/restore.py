# SPDX-License-Identifier: GPL-2.0-or-later
"""restore GLOB|all"""

from __future__ import annotations

from fnmatch import fnmatch

from ...errors import UnknownSymbolError
from ..registry import Command, register


@register
class Restore(Command):
    """Put back the original code of the instrumented functions matching GLOB
    ('all': every one). Their calls are no longer counted; the counts so far
    are kept (calls, top)."""

    name = "restore"
    arguments = "GLOB|all"
    summary = "un-instrument functions (their original code is back)"
    min_args = 1
    max_args = 1
    json_form = True
    stops_target = True
    completes = "traced"

    def run(self, session, args):
        pattern = "*" if args[0] == "all" else args[0]
        chosen = [fn for fn in session.traced_functions(True) if fnmatch(fn.name, pattern)]
        if not chosen:
            raise UnknownSymbolError(f"no instrumented function matches {args[0]!r}")
        patches = session.functions.restore({fn.name for fn in chosen})
        return {"restored": sorted(fn.name for fn in chosen), "patches": patches}

    def render(self, data):
        n = len(data["restored"])
        names = ", ".join(data["restored"][:10]) + (", ..." if n > 10 else "")
        return f"restored {n} function{'s' if n != 1 else ''} ({data['patches']} patches): {names}"
