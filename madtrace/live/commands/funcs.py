# SPDX-License-Identifier: GPL-2.0-or-later
"""funcs [GLOB]"""

from __future__ import annotations

from ...errors import UnknownSymbolError
from ..registry import Command, register

LIMIT = 200


def find_functions(space, pattern: str) -> list:
    """Functions matching GLOB: of the main executable, or 'module:GLOB'; a bare
    name elsewhere its definition (AddressSpace.functions_for_spec)."""
    return space.functions_for_spec(pattern)


@register
class Funcs(Command):
    """List the functions matching GLOB (default: every function of the main
    executable; 'libc.so.6:mem*' for a library), with their address, size and
    whether they are instrumented."""

    name = "funcs"
    arguments = "[GLOB]"
    summary = "list functions (and which ones are instrumented)"
    max_args = 1
    json_form = True
    completes = "functions"

    def run(self, session, args):
        pattern = args[0] if args else "*"
        found = find_functions(session.space, pattern)
        if not found:
            raise UnknownSymbolError(f"no function matches {pattern!r}")
        state = {}
        engine = session.functions
        for fn in session.traced_functions():
            state[fn.address] = (f"instrumented ({fn.method}, {len(fn.site_ids)} sites)"
                                 if fn.fid in engine.patches_of else "restored")
        return [{"name": ms.name, "module": ms.module.name, "address": ms.address,
                 "size": ms.symbol.size, "state": state.get(ms.address, "")} for ms in found]

    def render(self, data):
        lines = [f"{f['address']:#014x} {f['size']:>7}  {f['name']:<32} {f['module']}"
                 + (f"  [{f['state']}]" if f["state"] else "") for f in data[:LIMIT]]
        if len(data) > LIMIT:
            lines.append(f"... {len(data) - LIMIT} more (narrow the glob, or use --json)")
        return "\n".join(lines)
