# SPDX-License-Identifier: GPL-2.0-or-later
"""JSON output: one value on stdout, written without recursion (call trees can
be thousands of levels deep)."""

from __future__ import annotations

import json


def write_json(value, write) -> None:
    """json.dump without recursion."""
    pending: list[tuple[bool, object]] = [(False, value)]
    while pending:
        raw, item = pending.pop()
        if raw:
            write(item)
        elif isinstance(item, dict):
            write("{")
            pending.append((True, "}"))
            entries = list(item.items())
            for i in range(len(entries) - 1, -1, -1):
                key, v = entries[i]
                pending.append((False, v))
                pending.append((True, (", " if i else "") + json.dumps(str(key)) + ": "))
        elif isinstance(item, (list, tuple)):
            write("[")
            pending.append((True, "]"))
            for i in range(len(item) - 1, -1, -1):
                pending.append((False, item[i]))
                if i:
                    pending.append((True, ", "))
        else:
            write(json.dumps(item))
