"""MadT's text format (Tables I and II of the MadT paper), written and parsed.

Each line starts with the event type, then ``$`` for a symbolic line or ``#``
for a raw one, then the thread index (0 is the first thread seen) and ``:``:

  L$0:<malloc0013@fMallocHandle+45>+0,[heap],findDisparity+0x37   load, symbolic
  S#0:0x55d0c2a3b2c0,8,[heap],0x55d0c2a3a1f7                     store, raw
  M$0:<malloc0013@fMallocHandle+45>,528                          malloc of 528 bytes
  C$ / R$ ... ,size                                              calloc, realloc
  F$0:<freed:0013@fMallocHandle+45>                              free

Symbolic data addresses are ``symbol+offset`` (decimal offset): a forged heap
block name, a variable or ELF symbol, else ``region+offset``; the accessing
instruction is ``function+0xoffset``.  Madtrace's own choices where the paper
is silent: the number after ``$``/``#`` is the thread index; raw access lines
carry the size.
"""

from __future__ import annotations

import re

from ..binary.address_space import AddressSpace
from .blocks import block_name

LINE = re.compile(r"^(?P<kind>[LSYWGMCPREFU])(?P<mode>[$#])(?P<thread>\d+):(?P<body>.*)$")


def data_symbol(space: AddressSpace, address: int, block: dict | None, freed: bool) -> str:
    if block is not None:
        # the block's name when the access happened, not at the end of the recording
        name = block_name(block["kind"], block["id"], block["site"], freed)
        return f"{name}+{address - block['address']}"
    module = space.module_for(address)
    if module is not None:
        symbol = module.image.symbol_at(address - module.bias)
        if symbol is not None:
            return f"{symbol.name}+{address - module.bias - symbol.address}"
    region = space.region(address)
    mapping = space.mapping_for(address)
    base = mapping.start if mapping is not None else 0
    return f"{region}+{address - base}"


def instruction_symbol(space: AddressSpace, rip: int) -> str:
    return space.code_location(rip)


def bracketed(region: str) -> str:
    return region if region.startswith("[") else f"[{region}]"


def access_line(kind: str, thread: int, record, space: AddressSpace, block, raw: bool) -> str:
    address, rip = int(record["addr"]), int(record["rip"])
    region = bracketed(space.region(address))
    if raw:
        return f"{kind}#{thread}:{address:#x},{int(record['size'])},{region},{rip:#x}"
    return (f"{kind}${thread}:{data_symbol(space, address, block, bool(record['freed']))},"
            f"{region},{instruction_symbol(space, rip)}")


def alloc_line(kind: str, thread: int, block: dict, raw: bool) -> str:
    if kind in ("F", "U"):
        prefix = "<unmap:" if kind == "U" else "<freed:"
        what = f"{block['address']:#x}" if raw else f"{prefix}{block['id']:04d}@{block['site']}>"
        return f"{kind}{'#' if raw else '$'}{thread}:{what}"
    # the name the block had when it was made (it becomes <freed:...> when released)
    what = f"{block['address']:#x}" if raw else f"<{block['kind']}{block['id']:04d}@{block['site']}>"
    return f"{kind}{'#' if raw else '$'}{thread}:{what},{block['size']}"


def parse_line(line: str) -> dict:
    """One MadT line -> dict(kind, symbolic, thread, fields); ValueError if malformed."""
    m = LINE.match(line.rstrip("\n"))
    if not m:
        raise ValueError(f"not a MadT line: {line!r}")
    body = m["body"]
    fields: list[str] = []
    depth, current = 0, ""
    for ch in body:   # commas inside <...> or [...] do not split
        if ch in "<[":
            depth += 1
        elif ch in ">]":
            depth -= 1
        if ch == "," and depth == 0:
            fields.append(current)
            current = ""
        else:
            current += ch
    fields.append(current)
    return {"kind": m["kind"], "symbolic": m["mode"] == "$", "thread": int(m["thread"]),
            "fields": fields}
