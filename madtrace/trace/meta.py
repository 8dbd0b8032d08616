# SPDX-License-Identifier: GPL-2.0-or-later
"""meta.json of a trace directory, written and read (format.py names it; a
recording whose tracer was killed is settled on reading: partial.py)."""

from __future__ import annotations

import json
import os

from ..errors import CorruptTraceError, writing
from .blocks import seal_block_table
from .format import BLOCKS_FILE, FLIGHT_INDEX_FILE, FORMAT_VERSION, META_FILE, write_json_atomically
from .partial import settle


def write_meta(directory: str, meta: dict) -> None:
    """meta.json; once the recording's outcome is known (not "running"), the
    block table it wrote in place is sealed into the capture container first."""
    meta = dict(meta, format_version=FORMAT_VERSION)
    path = os.path.join(directory, META_FILE)
    if meta.get("outcome") != "running":
        with writing(os.path.join(directory, BLOCKS_FILE)):
            seal_block_table(os.path.join(directory, BLOCKS_FILE))
    with writing(path + ".tmp"):  # OutputError (exit 23), one line
        write_json_atomically(path, meta)


def _flight_snapshots(directory: str) -> list[str] | None:
    """The snapshots a flight recorder's folder lists, oldest first (None: not one)."""
    try:
        with open(os.path.join(directory, FLIGHT_INDEX_FILE)) as f:
            return [s["directory"] for s in json.load(f)["snapshots"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_meta(directory: str) -> dict:
    """meta.json; CorruptTraceError for anything but a trace directory of this
    version.  A recording whose tracer was killed is settled (trace/partial.py)."""
    if not os.path.isdir(directory):
        raise CorruptTraceError(f"{directory}: no such trace directory")
    meta_path = os.path.join(directory, META_FILE)
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        snapshots = _flight_snapshots(directory)
        if snapshots is not None:
            raise CorruptTraceError(
                f"{directory} holds a flight recorder's snapshots, each a trace directory: "
                + (f"read one (the last: {os.path.join(directory, snapshots[-1])})"
                   if snapshots else "none was written")) from None
        raise CorruptTraceError(f"{directory}: not a madtrace trace directory (no {META_FILE})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptTraceError(f"{meta_path}: corrupt ({exc})") from None
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if isinstance(version, int) and 0 < version < FORMAT_VERSION:
        raise CorruptTraceError(
            f"{directory}: a trace made by an older madtrace (format_version {version}, "
            f"this madtrace reads {FORMAT_VERSION}): record it again"
        )
    if not isinstance(meta, dict) or version != FORMAT_VERSION:
        raise CorruptTraceError(
            f"{meta_path}: unsupported or missing format_version (expected {FORMAT_VERSION})"
        )
    return settle(meta, directory)


def accesses_recorded(directory: str) -> int:
    """How many accesses a trace holds, without reading its access files (for a
    progress line): meta.json's counts, else (a trace cut short) the access
    records of the files' headers, which count a read-modify-write once where it
    is two accesses."""
    from .record_files import ACCESS_RECORDS, record_count
    try:
        counted = (read_meta(directory).get("accesses") or {}).values()
        total = sum(int(c["L"]) + int(c["S"]) for c in counted)
    except (CorruptTraceError, OSError, KeyError, TypeError, ValueError, AttributeError):
        total = 0
    return total or sum(record_count(path) for _, path in ACCESS_RECORDS.files(directory))
