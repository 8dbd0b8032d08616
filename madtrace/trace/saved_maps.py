# SPDX-License-Identifier: GPL-2.0-or-later
"""The memory maps a trace saved (maps.end.txt at the end, maps.start.txt when
tracing began: trace/format.py names them), read back for naming."""

from __future__ import annotations

import os
import re
import sys

from .format import MAPS_END_FILE, MAPS_START_FILE

# a line of /proc/PID/maps: range, permissions, offset, device, inode, path
_MAPS_LINE = re.compile(r"[0-9a-f]+-[0-9a-f]+ [r-][w-][x-][ps] [0-9a-f]+ [0-9a-f]+:[0-9a-f]+ \d+")
_maps_damage_said: set[str] = set()


def last_maps_text(directory: str) -> str | None:
    """The last memory map the trace holds (maps.end.txt, else
    maps.start.txt), None when it has neither.  A map damaged or cut short
    is read up to its first line that is not whole, and a line on stderr
    says so (the mappings after it go unnamed)."""
    for name in (MAPS_END_FILE, MAPS_START_FILE):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                return _intact_maps(path, f.read())
    return None


def _intact_maps(path: str, text: str) -> str:
    lines = text.split("\n")
    whole = lines[:-1]  # a map madtrace wrote ends with a newline
    bad = next((i for i, line in enumerate(whole) if not _MAPS_LINE.match(line)), None)
    if bad is None and not lines[-1]:
        return text
    cut = len(whole) if bad is None else bad
    if path not in _maps_damage_said:
        _maps_damage_said.add(path)
        print(
            f"madtrace: {path}: damaged at line {cut + 1} (cut short?): read up to there, "
            f"the mappings after it go unnamed",
            file=sys.stderr,
            flush=True,
        )
    return "".join(line + "\n" for line in whole[:cut])


