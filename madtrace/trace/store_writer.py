# SPDX-License-Identifier: GPL-2.0-or-later
"""StoreWriter: writes a trace's store (DIR/store, columnar.py) from its raw
capture once every file is complete (the target ended, or a snapshot).

It writes every table in one pass of the segmentation over the raw capture
(store_tables.py): records, calls, the access rows and their names, then
allocations, sites, block events; then ``store/meta.json`` with
``"complete": true``.  Long builds print their progress on stderr.

Nothing is written while the target runs: the summary needs no store
(access_counts.py), and a store written meanwhile would take the CPU the
target needs.  ``ensure_store`` builds the store on first use (a query, an
export, a report that reads rows); ``madtrace record --store`` right after the
target ends.  Memory stays bounded: the segmentation's chunks, and the Parquet
parts being encoded.
"""

from __future__ import annotations

import os
import shutil
import sys

from ..progress import Progress
from .meta import accesses_recorded
from .format import STORE_FORMAT_VERSION, load_functions, read_store_meta, store_path, write_store_meta
from .record_files import (CALL_RECORDS, capture_sources, store_is_complete)


class StoreWriter:
    """See the module docstring."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(store_path(directory), exist_ok=True)
        write_store_meta(directory, {"complete": False})

    def _captured_events(self) -> int:
        """Call records and accesses (an estimate for the progress line)."""
        return CALL_RECORDS.total_rows(self.directory) + accesses_recorded(self.directory)

    def finish(self, out=sys.stderr) -> dict:
        """Every file is complete: write the tables.  Returns the store's meta."""
        from .store_tables import write_final_tables
        progress = Progress("store: records, calls and accesses", self._captured_events(), out)
        rows = write_final_tables(self.directory, progress)
        progress.done()
        meta = {"complete": True, "rows": rows}
        meta.update(_clock(self.directory))
        meta["sources"] = capture_sources(self.directory)    # what it was built from
        write_store_meta(self.directory, meta)
        return read_store_meta(self.directory)


def _clock(directory: str) -> dict:
    doc = load_functions(directory)
    if doc is None:
        return {"timestamps": False, "tsc_hz": None}
    return {"timestamps": bool(doc.get("timestamps", True)), "tsc_hz": doc.get("tsc_hz")}


def build_store(directory: str, out=sys.stderr) -> dict:
    """Write DIR/store from the raw capture (replacing whatever is there)."""
    shutil.rmtree(store_path(directory), ignore_errors=True)
    return StoreWriter(directory).finish(out)



def ensure_store(directory: str, out=sys.stderr) -> None:
    """Build the store if it is missing, incomplete or of another format
    (StoreError when it cannot be written)."""
    from ..errors import StoreError
    if store_is_complete(directory):
        return
    meta = read_store_meta(directory)
    try:        # a store that cannot be written fails here, before any message
        shutil.rmtree(store_path(directory), ignore_errors=True)
        os.makedirs(store_path(directory))
    except OSError as exc:
        raise StoreError(f"cannot write the store of {directory}: {exc.strerror or exc}") from None
    if out is not None:
        why = "has none" if meta is None else (
            f"is of format {meta.get('format_version')}, not {STORE_FORMAT_VERSION}"
            if meta.get("format_version") != STORE_FORMAT_VERSION else "is incomplete"
            if not meta.get("complete") else "is older than the capture files it was built from")
        print(f"madtrace: building the store of {directory} (it {why})", file=out, flush=True)
    try:
        build_store(directory, out)
    except OSError as exc:
        raise StoreError(f"cannot write the store of {directory}: {exc.strerror or exc}") from None
