# SPDX-License-Identifier: GPL-2.0-or-later
"""x ADDR|SYMBOL [N]"""

from __future__ import annotations

import re

from ...errors import TargetMemoryError, UnknownSymbolError, UsageError
from ..registry import Command, register

DEFAULT_SIZE = 64
MAX_SIZE = 1 << 16
_OFFSET = re.compile(r"^(.+?)\+(0x[0-9a-fA-F]+|\d+)$")


def resolve_address(space, text: str) -> int:
    """An integer (0x... or decimal), a symbol or variable, or SYMBOL+OFFSET."""
    try:
        return int(text, 0)
    except ValueError:
        pass
    offset = 0
    m = _OFFSET.match(text)
    if m:
        text, offset = m.group(1), int(m.group(2), 0)
    try:
        return space.find_symbol(text).address + offset
    except UnknownSymbolError:
        pass
    try:
        return space.find_variable(text).address + offset
    except UnknownSymbolError:
        raise UnknownSymbolError(f"x: not an address, symbol or variable: {text!r}") from None


def hex_dump(address: int, data: bytes) -> list[str]:
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i:i + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{address + i:#014x}  {hexes:<47}  {text}")
    return lines


@register
class Examine(Command):
    """Hex dump N bytes (default 64) of the target's memory at ADDR (0x...),
    a symbol or variable name, or SYMBOL+OFFSET; the address is symbolized."""

    name = "x"
    arguments = "ADDR|SYMBOL [N]"
    summary = "hex dump of target memory at an address or symbol"
    min_args = 1
    max_args = 2
    json_form = True
    completes = "symbols"

    def run(self, session, args):
        space = session.space
        address = resolve_address(space, args[0])
        try:
            size = int(args[1], 0) if len(args) > 1 else DEFAULT_SIZE
        except ValueError:
            raise UsageError(f"x: not a size: {args[1]!r}") from None
        if not 0 < size <= MAX_SIZE:
            raise UsageError(f"x: size must be between 1 and {MAX_SIZE}")
        try:
            data = session.tracee.mem.read(address, size)
        except TargetMemoryError:
            raise
        except OSError as exc:
            raise TargetMemoryError(f"x: cannot read {size} bytes at {address:#x}: {exc}") from None
        return {"address": address, "symbol": space.symbolize(address),
                "region": space.region(address), "size": len(data), "hex": data.hex()}

    def render(self, d):
        header = f"{d['address']:#x}: {d['symbol']} [{d['region']}]"
        return "\n".join([header] + hex_dump(d["address"], bytes.fromhex(d["hex"])))
