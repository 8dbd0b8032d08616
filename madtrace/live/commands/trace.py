# SPDX-License-Identifier: GPL-2.0-or-later
"""trace data on [REGION-GLOB...] [in FUNC-GLOB...] | trace data in FUNC-GLOB... | trace data off"""

from __future__ import annotations


from ...errors import UnknownSymbolError, UsageError
from ..registry import Command, register
from .funcs import find_functions

USAGE = "trace data on [REGION-GLOB...] [in FUNC-GLOB...] | trace data in FUNC-GLOB... | trace data off"


def data_tracing_state(session, message: str) -> dict:
    """What a command that turned data tracing on reports (text and --json)."""
    engine = session.recording.data
    return {"message": message, "on": bool(engine is not None and engine.active),
            "regions": [[r.start, r.end, r.label] for r in engine.regions.regions] if engine else [],
            "pages": len(engine.protected) if engine else 0,
            "inside": session.scratch.get("data_in", [])}


def split_selection(args: list[str]) -> tuple[list[str], list[str] | None]:
    """``data on A B in F G`` -> (["A", "B"], ["F", "G"]); ``data in F`` -> ([], ["F"]);
    the functions are None without ``in``."""
    rest = args[2:]
    if args[1] == "in":
        return [], rest
    if "in" in rest:
        i = rest.index("in")
        return rest[:i], rest[i + 1:]
    return rest, None


@register
class Trace(Command):
    """Turn data-access tracing on or off while the target runs: every load and
    store to the traced regions is recorded (as madtrace record --data).

      trace data on                      the .data/.bss of every module and the heap
      trace data on '.bss of prog' '[heap]'   only the regions whose label matches
      trace data on in parse* 'libfoo.so:dec*'   only while a thread is inside a
                                         matching function (calls it makes included)
      trace data on '[heap]' in parse*   both
      trace data in parse*               the same as 'trace data on in parse*'
      trace data off                     stop (what was recorded is kept)

    Region labels are those of 'maps' and of 'status' ('.data of MODULE',
    '.bss of MODULE', '[heap]'); function globs are those of 'instrument'."""

    name = "trace"
    arguments = "data on [REGION-GLOB...] [in FUNC-GLOB...] | data in FUNC-GLOB... | data off"
    summary = "turn data-access tracing on (for some regions, inside some functions) or off"
    min_args = 2
    max_args = None
    json_form = True
    stops_target = True

    def check(self, args):
        what, switch = args[0], args[1]
        if what != "data" or switch not in ("on", "off", "in") or (switch == "off" and args[2:]):
            raise UsageError(f"usage: {USAGE}")
        regions, functions = split_selection(args)
        if functions is not None and not functions:
            raise UsageError(f"trace data: 'in' needs at least one function glob (usage: {USAGE})")
        if functions and "in" in functions:
            raise UsageError(f"trace data: 'in' given twice (usage: {USAGE})")

    def keywords(self, args):
        if not args:
            return ["data"]
        if len(args) == 1:
            return ["on", "off", "in"]
        if args[1] == "on" and "in" not in args[2:]:
            return ["in"]
        return []

    def completion_kind(self, args):
        if len(args) < 2 or args[1] == "off":
            return None
        if args[1] == "in" or "in" in args[2:]:
            return "functions"
        return "regions"

    def run(self, session, args):
        recording = session.recording
        if args[1] == "off":
            message = recording.stop_data_tracing()
            session.scratch.pop("data_in", None)
            return data_tracing_state(session, message)
        regions, functions = split_selection(args)
        selection = {}
        if regions:
            from ...data.regions import region_matcher
            selection["region_filter"] = region_matcher(regions)
        if functions:
            patched = recording.entry_patched()
            for glob in functions:
                try:
                    found = find_functions(session.space, glob)
                except UnknownSymbolError as exc:
                    raise UnknownSymbolError(f"trace data in: {exc}") from None
                if not found:
                    raise UnknownSymbolError(f"trace data in: no function matches {glob!r}")
                for symbol in found:
                    if symbol.address in patched:
                        raise UsageError(
                            f"trace data in: {symbol.name} is instrumented at its entry "
                            f"(its first bytes are patched): 'restore {symbol.name}' first, "
                            f"or trace data in the functions that call it")
            selection["data_in"] = list(functions)
        message = recording.start_data_tracing(**selection)
        if functions:
            session.scratch["data_in"] = list(functions)
            message += f"; only inside {', '.join(functions)}"
        return data_tracing_state(session, message)

    def render(self, data):
        return data["message"]
