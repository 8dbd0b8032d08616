# SPDX-License-Identifier: GPL-2.0-or-later
"""export --format lackey: the data events in valgrind lackey's --trace-mem format."""

from __future__ import annotations

import os

from ..errors import NoDataError
from ..trace.format import DATA_DIR
from . import Export, write_lines


def require_data(directory: str) -> None:
    if not os.path.isdir(os.path.join(directory, DATA_DIR)):
        raise NoDataError(f"{directory} has no data accesses: record it with --data")


def lackey_lines(directory: str):
    """lackey's --trace-mem format: "I  addr,len" for each execution of an
    instruction that accessed traced memory, then its " L addr,size" and
    " S addr,size" lines; a load and a store of the same bytes by one
    execution are one " M" line, as lackey writes them."""
    from ..trace.events import AllocEvent, ordered_events
    from ..trace.format import KIND_LOAD

    pending = None  # a load that may turn into an M
    for _order, _tid, event in ordered_events(directory):
        if isinstance(event, AllocEvent):
            continue
        address, size = int(event["addr"]), int(event["size"])
        kind = "L" if int(event["kind"]) == KIND_LOAD else "S"
        if pending is not None:
            if kind == "S" and not event["first"] and pending == (address, size):
                yield f" M {address:08x},{size}"
                pending = None
                continue
            yield f" L {pending[0]:08x},{pending[1]}"
            pending = None
        if event["first"]:
            yield f"I  {int(event['rip']):08x},{int(event['ilen'])}"
        if kind == "L":
            pending = (address, size)
        else:
            yield f" S {address:08x},{size}"
    if pending is not None:
        yield f" L {pending[0]:08x},{pending[1]}"


def _write(args) -> int:
    require_data(args.directory)
    return write_lines(args, lackey_lines(args.directory))


EXPORT = Export(name="lackey", help="or valgrind lackey's --trace-mem format", order=1, write=_write)
