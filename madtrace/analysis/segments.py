"""Function-segmented traces: each dynamic call with the data accesses it made,
in exact order (madtrace report DIR --kind segments).

A data access recorded with sequence number ``seq`` happened after the
thread's first ``seq`` call records (entry/exit tags) and before the next one,
so merging the two streams by position gives every access its call.  Names
come from the module files and the memory map saved in the trace directory:
a DWARF variable (``values[3]``, ``config.name+2``) when there is one, else
``symbol+0xoff``, else the region.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..binary.address_space import AddressSpace
from ..binary.maps import parse_maps
from ..capture.data import ACCESS_DTYPE, KIND_LOAD
from ..capture.rings import RECORD_DTYPE
from .calltree import load_tables, thread_files

KIND_CHAR = {KIND_LOAD: "L", 2: "S"}


def address_space_of(directory: str) -> AddressSpace:
    for name in ("maps.end.txt", "maps.start.txt"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with open(path) as f:
                return AddressSpace.from_maps(parse_maps(f.read()))
    return AddressSpace.from_maps([])


def load_blocks(directory: str) -> dict[int, dict]:
    path = os.path.join(directory, "data", "allocations.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {b["id"]: b for b in json.load(f)}


def block_name(block: dict, address: int, freed: bool) -> str:
    """MadT's forged name: <malloc0014@func+230>+off, <freed:0014@...> once released."""
    name = f"<freed:{block['id']:04d}@{block['site']}>" if freed else block["name"]
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
    """Yields the lines of the segmented listing."""
    tables = load_tables(directory)
    space = address_space_of(directory)
    blocks = load_blocks(directory)
    lines = 0
    for tid, path in thread_files(directory):
        records = np.fromfile(path, dtype=RECORD_DTYPE)
        acc_path = os.path.join(directory, "data", f"{tid}.acc")
        accesses = np.fromfile(acc_path, dtype=ACCESS_DTYPE) if os.path.exists(acc_path) \
            else np.zeros(0, dtype=ACCESS_DTYPE)
        yield f"== thread {tid}: {len(records)} call records, {len(accesses)} data accesses"
        stack: list[list] = []   # [fid, shown, total] per open call
        outside = [-1, 0, 0]     # accesses made outside any traced call
        a = 0

        def flush_accesses(upto: int):
            nonlocal a
            while a < len(accesses) and accesses[a]["seq"] <= upto:
                acc = accesses[a]
                a += 1
                frame = stack[-1] if stack else outside
                frame[2] += 1
                if frame[1] >= max_accesses:
                    continue
                frame[1] += 1
                indent = "  " * (len(stack) + 1)
                address = int(acc["addr"])
                block = blocks.get(int(acc["block"]))
                name = block_name(block, address, bool(acc["freed"])) if block \
                    else data_name(space, address)
                yield (f"{indent}{KIND_CHAR.get(int(acc['kind']), '?')}$ "
                       f"{name},[{space.region(address)}],"
                       f"{instruction_name(space, int(acc['rip']))}")

        for i, record in enumerate(records):
            if not stack:
                outside[1] = 0   # show a few accesses of each stretch between top-level calls
            for line in flush_accesses(i):
                yield line
            code = int(record["code"])
            fid = tables.code_fid[code] if code < tables.n_codes else -1
            name = tables.names[fid] if fid >= 0 else f"<site {code >> 1}>"
            if code & 1 == 0:
                yield f"{'  ' * (len(stack) + 1)}> {name}"
                stack.append([fid, 0, 0])
            else:
                while stack:
                    frame = stack.pop()
                    hidden = frame[2] - frame[1]
                    indent = "  " * (len(stack) + 1)
                    tail = f" (+{hidden} more accesses)" if hidden else ""
                    yield f"{indent}< {tables.names[frame[0]] if frame[0] >= 0 else '?'}" \
                          f" [{frame[2]} accesses]{tail}"
                    if frame[0] == fid:
                        break
            lines += 1
            if lines >= max_lines:
                yield f"  … {len(records) - i - 1} more call records (raise --top)"
                break
        else:
            for line in flush_accesses(len(records)):
                yield line
        if outside[2] > outside[1]:
            yield f"  ({outside[2]} accesses outside traced calls, {outside[1]} shown)"
