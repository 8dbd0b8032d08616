# SPDX-License-Identifier: GPL-2.0-or-later
"""What the data engine is asked to do, and what it borrows from function tracing:
the two halves of its construction (engine.py), each a dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .regions import Region


@dataclass
class DataChoices:
    """What data tracing records: the options of --data and of the REPL's ``trace data``.

    ``engine``: "fault" (every access a fault) or "hybrid" (hybrid/alias.py: memory
    aliased; hybrid/paths.py: instructions record their own accesses);
    ``only_regions``: trace these ranges (watched variables), and no default region
    unless ``region_filter`` also keeps some (--regions); ``data_in``: function
    globs, record only inside them (gate.py); ``only_blocks``: record only accesses
    to these heap blocks (--only malloc0014); ``block_events``: memcpy/memmove/memset
    calls as one Y/W event each; ``track_allocations``: malloc & co. followed."""

    engine: str = "fault"
    only_regions: list[Region] | None = None
    region_filter: Callable | None = None
    data_in: list[str] | None = None
    only_blocks: set[int] | None = None
    block_events: bool = True
    track_allocations: bool = True
    loads: bool = True
    stores: bool = True


@dataclass
class FunctionTracingLinks:
    """What the data engine needs of function tracing (each absent without it):
    ``sequence_of(tid)``: the thread's call-record count; ``sequence_address(tid)``:
    where the tracer's copy of it lives (0: none); ``patched_addresses``: the
    functions patched at their entry; ``original_address(rips)``: the addresses
    recorded for instructions (prologues relocated into trampolines are recorded at
    the original instruction's address); ``rings``: the function tracer's (the
    hybrid engine's data records go there too; None: it makes its own);
    ``entry_links``: where function tracing's entry trampolines go on to
    (calls/entry_links.py); ``original_return(address)``: the program's return
    address of one inside a call-site trampoline (an allocation's call site is
    the program's, not the trampoline's)."""

    sequence_of: Callable | None = None
    sequence_address: Callable | None = None
    patched_addresses: set[int] | None = None
    original_address: Callable | None = None
    rings: Any = None
    entry_links: Any = None
    original_return: Callable | None = None
