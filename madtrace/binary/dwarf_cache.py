# SPDX-License-Identifier: GPL-2.0-or-later
"""The DWARF cache: what madtrace reads from a binary's DWARF (variables with
their types and fields, line tables), kept on disk once per binary so that a
second run loads it in milliseconds.

One entry per binary, ``<key>.mtc`` of the cache (cache/disk.py: where,
the key, the checked file), magic ``MTCACHE1``; its payload is
dwarf_native.py's format.  A corrupt entry is rebuilt and one line says so.

``dwarf_of(image)`` gives the ``DwarfData`` of an ``ElfImage`` (from the cache,
else read and cached); ``line_table(image)`` its line table.  dwarf_prefetch.py
reads the binaries that have no entry yet while the target runs.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

from ..cache import disk
from ..progress import Activity
from .dwarf_lines import LineTable
from .dwarf_native import DwarfData, parse_dwarf, read_dwarf, summarize

MAGIC = b"MTCACHE1"
FORMAT = 1
SUFFIX = ".mtc"
NICE = 3


progress_out = sys.stderr       # where a read that takes long says so (None: quiet)
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_loaded: dict[str, DwarfData] = {}
_tables: dict[int, LineTable] = {}      # id(image) -> its line table
seconds = 0.0                   # spent in dwarf_of (loading, reading, waiting for a prefetch)


def entry_path(image) -> str:
    return os.path.join(disk.cache_dir(), disk.cache_key(image) + SUFFIX)


def _build(image, path: str, low_priority: bool = False) -> DwarfData:
    """Reads the binary's DWARF and writes its entry; returns what it holds."""
    source, st = disk.source_of(image)
    with tempfile.TemporaryDirectory(prefix="madtrace-dwarf-") as tmp:
        out = os.path.join(tmp, "dwarf")
        if not read_dwarf(source, out, nice=NICE if low_priority else 0):
            return DwarfData([], LineTable.empty())     # debug sections libdw finds empty
        with open(out, "rb") as f:
            payload, data = summarize(f.read())
    disk.write_entry(path, {"path": source, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                               "build_id": disk.build_id(image), "created": time.time()},
                        payload, MAGIC, FORMAT)
    return data


def lock_for(key: str) -> threading.Lock:
    """The lock held while ``key``'s entry is built (dwarf_of; a prefetch)."""
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def dwarf_of(image, low_priority: bool = False) -> DwarfData:
    """The DWARF data of an ElfImage that has debug info (see module doc)."""
    global seconds
    started = time.perf_counter()
    try:
        return _dwarf_of(image, low_priority)
    finally:
        if threading.current_thread() is threading.main_thread():
            seconds += time.perf_counter() - started


def _dwarf_of(image, low_priority: bool) -> DwarfData:
    try:
        key = disk.cache_key(image) if image.path is not None else None
    except OSError:                        # deleted since it was mapped: read the bytes held
        key = None
    if key is None:                        # nothing to key it by
        return _uncached(image)
    hit = _loaded.get(key)
    if hit is not None:
        return hit
    path = os.path.join(disk.cache_dir(), key + SUFFIX)
    with lock_for(key):                   # a prefetch of the same binary: wait for it
        hit = _loaded.get(key)
        if hit is not None:
            return hit
        data = None
        if os.path.exists(path):
            try:
                data = parse_dwarf(disk.read_entry(path, MAGIC, FORMAT)[1])
            except disk.CorruptEntry as exc:
                disk.notify(f"symbol cache: {path} was corrupt ({exc}); rebuilt")
        if data is None:
            with Activity(f"reading the debug info of {image.name} (once per binary)",
                          None if low_priority else progress_out):
                data = _build(image, path, low_priority)
        _loaded[key] = data
        return data


def _uncached(image) -> DwarfData:
    with tempfile.TemporaryDirectory(prefix="madtrace-dwarf-") as tmp:
        source, out = os.path.join(tmp, "image"), os.path.join(tmp, "dwarf")
        with open(source, "wb") as f:
            f.write(image.read(0, 1 << 62))
        if not read_dwarf(source, out):
            return DwarfData([], LineTable.empty())
        with open(out, "rb") as f:
            return parse_dwarf(f.read())


def line_table(image) -> LineTable:
    """The line table of an ``ElfImage`` (read once per binary)."""
    table = _tables.get(id(image))
    if table is None:
        table = dwarf_of(image).lines if getattr(image, "has_debug_info", False) \
            else LineTable.empty()
        _tables[id(image)] = table
    return table


def is_loaded(key: str) -> bool:
    return key in _loaded


def is_cached(image) -> bool:
    return image.path is not None and os.path.exists(entry_path(image))


# ---------------------------------------------------------- cache list|clear
def list_entries() -> list[dict]:
    return disk.list_entries(SUFFIX, MAGIC, FORMAT)


def clear() -> tuple[int, int]:
    result = disk.clear(SUFFIX)
    _loaded.clear()
    return result
