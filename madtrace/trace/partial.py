# SPDX-License-Identifier: GPL-2.0-or-later
"""A trace directory whose recording never finished.

When a recording starts, meta.json says ``"outcome": "running"`` with the
tracer's pid; the end of the recording replaces it.  If that tracer is gone
(SIGKILL, a crash, the machine's OOM killer), what reached the disk is still
a trace: the call records drained so far, the accesses spooled so far, the
function and site tables written at start.  ``settle`` turns such a meta.json
into ``"outcome": "tracer killed"``, ``partial: true``, with the calls counted
from the records, and says so once, in one line, on stderr.
"""

from __future__ import annotations

import os
import sys

from ..errors import CorruptTraceError
from .format import STORE_DIR, load_functions

_noted: set[str] = set()


def tracer_alive(pid: int | None) -> bool:
    """Whether ``pid`` is still a madtrace process (a live recording)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
    except OSError:
        return False
    return b"madtrace" in command or b"tracer" in command


def settle(meta: dict, directory: str) -> dict:
    if meta.get("outcome") != "running" or tracer_alive(meta.get("tracer_pid")):
        return meta
    meta = dict(meta, outcome="tracer killed", partial=True, end_time=last_write(directory))
    meta["calls"] = recovered_calls(directory)
    key = os.path.realpath(directory)
    if key not in _noted:
        _noted.add(key)
        print(f"madtrace: {directory}: the recording was cut short (its tracer was killed): "
              f"a partial trace, the counts of what reached the disk", file=sys.stderr)
    return meta


def last_write(directory: str) -> float:
    """When the recording last wrote to the directory (the end of what is known)."""
    latest = os.path.getmtime(directory)
    for folder, _dirs, names in os.walk(directory):
        if os.path.basename(folder) == STORE_DIR:
            continue
        for name in names:
            try:
                latest = max(latest, os.path.getmtime(os.path.join(folder, name)))
            except OSError:
                pass
    return latest


def recovered_calls(directory: str) -> dict[str, int]:
    """Calls per function from the call records on disk (entries, as the tracer counts)."""
    try:
        tables = load_functions(directory)
    except CorruptTraceError:
        return {}
    if tables is None:
        return {}
    from .reader import entry_counts
    sites = tables.get("sites", [])
    per_site = entry_counts(directory, len(sites))
    counts = {fn["name"]: 0 for fn in tables.get("functions", [])}
    for site in sites:
        counts[site["function"]] = counts.get(site["function"], 0) + int(per_site[site["sid"]])
    return counts
