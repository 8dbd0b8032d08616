# SPDX-License-Identifier: GPL-2.0-or-later
"""export --format madt: the data events as MadT's text (symbolic, or --raw)."""

from __future__ import annotations

from . import Export, write_lines


def madt_lines(directory: str, raw: bool):
    from ..trace.blocks import load_allocations
    from ..trace.events import AllocEvent, ordered_events
    from ..trace.format import KIND_LOAD
    from ..trace.madt import access_line, alloc_line
    from ..trace.naming import address_space_of

    space = address_space_of(directory)
    blocks = {b["id"]: b for b in load_allocations(directory)}
    threads: dict[int, int] = {}
    for _order, tid, event in ordered_events(directory):
        thread = threads.setdefault(tid, len(threads))
        if isinstance(event, AllocEvent):
            yield alloc_line(event.kind, thread, event.block, raw)
        else:
            kind = "L" if int(event["kind"]) == KIND_LOAD else "S"
            yield access_line(kind, thread, event, space, blocks.get(int(event["block"])), raw)


def _arguments(parser) -> None:
    parser.add_argument("--raw", action="store_true", help="madt: numeric addresses (# lines)")


def _write(args) -> int:
    from .lackey import require_data

    require_data(args.directory)
    return write_lines(args, madt_lines(args.directory, args.raw))


EXPORT = Export(
    name="madt",
    help="its data events as MadT's text (symbolic, or --raw)",
    order=0,
    write=_write,
    add_arguments=_arguments,
)
