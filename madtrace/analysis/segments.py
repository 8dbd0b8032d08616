"""Function-segmented traces: each dynamic call with the data accesses it made,
in exact order (madtrace report DIR --kind segments).

A data access recorded with sequence number ``seq`` happened after the
thread's first ``seq`` call records (entry/exit tags) and before the next one;
segmentation.py merges the two streams with the exact frame rules of the call
records (tail calls, longjmp, unmatched exits), so every access gets its call.  Names
come from the module files and the memory map saved in the trace directory:
a DWARF variable (``values[3]``, ``config.name+2``) when there is one, else
``symbol+0xoff``, else the region.
"""

from __future__ import annotations

import numpy as np

from ..binary.address_space import AddressSpace
from ..trace.blocks import block_name as forged_name
from ..trace.blocks import load_allocations
from ..trace.record_files import ACCESS_RECORDS, CALL_RECORDS
from ..trace.format import KIND_LOAD, KIND_STORE
from ..trace.naming import address_space_of
from ..trace.replay import EVENT_ACCESS, EVENT_BEGIN, FATE_COMPLETED, FATES
from ..trace.segmentation import iter_thread_chunks, load_tables

KIND_CHAR = {KIND_LOAD: "L", KIND_STORE: "S"}


def block_name(block: dict, address: int, freed: bool) -> str:
    """MadT's forged name: <malloc0014@func+230>+off, <freed:0014@...> once released."""
    name = forged_name(block["kind"], block["id"], block["site"], freed)
    offset = address - block["address"]
    return f"{name}+{offset}" if offset else name


def data_name(space: AddressSpace, address: int) -> str:
    variable = space.variable_at(address)
    if variable is not None:
        return variable.describe()
    return space.symbolize(address).split(" (")[0]


def instruction_name(space: AddressSpace, rip: int) -> str:
    return space.code_location(rip)


def segments(directory: str, max_accesses: int = 8, max_lines: int = 400):
    """Yields the lines of the segmented listing: ``> f`` where a call begins,
    its first ``max_accesses`` accesses, ``< f [N accesses]`` where it ends
    (N: the accesses it made itself, its callees' not included; "unwound"
    when a longjmp left it, "open" when the records ended first); at most
    ``max_lines`` call records per thread."""
    tables = load_tables(directory, required=False)
    space = address_space_of(directory)
    blocks = {b["id"]: b for b in load_allocations(directory)}
    names = tables.names
    shown: dict[int, int] = {}      # call_id -> accesses listed so far (open calls)
    lines = 0
    outside = [0, 0, 0]             # accesses outside traced calls: shown in this stretch,
    #                                 total, shown in all
    cut = False
    current = None
    for chunk in iter_thread_chunks(directory, tables=tables):
        if chunk.tid != current:
            current = chunk.tid
            yield _thread_header(directory, chunk.tid)
        if chunk.last:
            if not cut:
                yield from _ends(chunk, names)
            yield from _thread_footer(chunk, outside)
            shown.clear()
            lines, outside, cut = 0, [0, 0, 0], False
            continue
        if cut:
            outside[1] += int(np.count_nonzero(chunk.access_call_ids == -1))
            continue
        segment_of = {int(c): i for i, c in enumerate(chunk.segments["call_id"])}
        for i, ev in enumerate(chunk.events):
            typ, call, depth = int(ev["type"]), int(ev["call_id"]), int(ev["depth"])
            indent = "  " * (depth + 1) if typ == EVENT_ACCESS else "  " * depth
            if typ == EVENT_ACCESS:
                if call < 0:
                    outside[1] += 1
                    if outside[0] >= max_accesses:
                        continue
                    outside[0] += 1
                    outside[2] += 1
                else:
                    n = shown.get(call, 0)
                    if n >= max_accesses:
                        continue
                    shown[call] = n + 1
                acc = chunk.accesses[int(ev["ref"]) - chunk.access_start]
                yield indent + access_text(space, blocks, acc)
                continue
            lines += 1
            if typ == EVENT_BEGIN:
                if depth == 1:
                    outside[0] = 0   # show a few accesses of each stretch between top calls
                yield f"{indent}> {_name(names, int(ev['fid']))}"
            else:
                yield _end_line(indent, names, ev, chunk.segments[segment_of[call]], shown)
            if lines >= max_lines:
                cut = True
                rest = chunk.events[i + 1:]
                outside[1] += int(np.count_nonzero((rest["type"] == EVENT_ACCESS) &
                                                   (rest["call_id"] == -1)))
                yield "  … more call records (raise --top or --depth)"
                break


def _name(names: list[str], fid: int) -> str:
    return names[fid] if 0 <= fid < len(names) else f"<function {fid}>"


def _thread_header(directory: str, tid: int) -> str:
    records = CALL_RECORDS.rows(CALL_RECORDS.path(directory, tid))
    accesses = ACCESS_RECORDS.thread_rows(directory, tid)   # .acc or .dat
    return f"== thread {tid}: {records} call records, {accesses} data accesses"


def _end_line(indent: str, names: list[str], ev, segment, shown: dict) -> str:
    call = int(ev["call_id"])
    total = int(segment["accesses_self"])
    hidden = total - shown.pop(call, 0)
    fate = int(ev["fate"])
    note = "" if fate == FATE_COMPLETED else f" ({FATES[fate]})"
    tail = f" (+{hidden} more accesses)" if hidden > 0 else ""
    return f"{indent}< {_name(names, int(ev['fid']))} [{total} accesses]{note}{tail}"


def _ends(chunk, names: list[str]):
    """The END lines of the calls still open when the thread's records ended."""
    for ev, segment in zip(chunk.events, chunk.segments):
        yield _end_line("  " * int(ev["depth"]), names, ev, segment, {})


def _thread_footer(chunk, outside: list[int]):
    if outside[1] > outside[2]:
        yield f"  ({outside[1]} accesses outside traced calls, {outside[2]} shown)"


def access_text(space: AddressSpace, blocks: dict, acc) -> str:
    """``S$ values[3],[.bss of prog],fill+0x2b``: kind, data name, region, instruction."""
    address = int(acc["addr"])
    block = blocks.get(int(acc["block"]))
    name = block_name(block, address, bool(acc["freed"])) if block else data_name(space, address)
    return (f"{KIND_CHAR.get(int(acc['kind']), '?')}$ {name},[{space.region(address)}],"
            f"{instruction_name(space, int(acc['rip']))}")
