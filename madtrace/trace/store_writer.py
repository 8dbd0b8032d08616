# SPDX-License-Identifier: GPL-2.0-or-later
"""StoreWriter: writes a trace's store (DIR/store, columnar.py) from its raw
capture once every file is complete (the target ended, or a snapshot).

It writes the ``records`` table from ``calls/<tid>.rec`` (a record's place in
its thread's merged stream, ``pos``, counts the accesses before it), then the
tables that need the whole replay (store_tables.py): calls, the access rows
and their names, allocations, sites, block events; then ``store/meta.json``
with ``"complete": true``.  Long builds print their progress on stderr.

Nothing is written while the target runs: the summary needs no store
(access_counts.py), and a store written meanwhile would take the CPU the
target needs.  ``ensure_store`` builds the store on first use (a query, an
export, a report that reads rows); ``madtrace record --store`` right after the
target ends.  Memory stays bounded: one batch of ``BATCH_ROWS`` rows (and the
segmentation's chunks) at a time.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np

from ..errors import CorruptTraceError
from ..progress import Progress
from .meta import read_meta
from .format import STORE_FORMAT_VERSION, load_functions, read_store_meta, store_path, write_store_meta
from .record_files import (ACCESS_RECORDS, CALL_RECORDS, SeqFollower, capture_sources, record_count,
                           store_is_complete)

BATCH_ROWS = 1 << 19


class RecordFollower:
    """One thread's records: how far they are written, and the accesses before them."""

    def __init__(self, directory: str, tid: int, flusher=None):
        from .columnar import PartWriter     # pyarrow: imported by the thread that writes
        self.tid = tid
        self.rec_path = CALL_RECORDS.path(directory, tid)
        self.acc = SeqFollower(directory, tid)    # data/<tid>.acc, or a .dat decoded as it grows
        self.writer = PartWriter(directory, "records", tid, flusher)
        self.records = 0      # records written
        self.accesses = 0     # accesses before the next record

    def step(self) -> int:
        """Write the next batch of records; returns how many."""
        n_rec = CALL_RECORDS.rows(self.rec_path)
        n_acc = self.acc.count()
        p0 = self.records
        p1 = min(n_rec, p0 + BATCH_ROWS)
        if p1 <= p0:
            return 0
        records = CALL_RECORDS.read(self.rec_path, p0, p1 - p0)
        before = self._accesses_before(p0, p1, n_acc)
        seq = np.arange(p0, p1, dtype=np.int64)
        self.writer.write({"pos": seq + before, "seq": seq, "tsc": records["tsc"],
                           "code": records["code"], "rsp": records["rsp"]})
        self.records = p1
        return p1 - p0

    def _accesses_before(self, p0: int, p1: int, n_acc: int) -> np.ndarray:
        """For each record p0..p1-1: the thread's accesses with seq <= p (the
        accesses with seq <= p1-1 are consumed)."""
        counts = np.zeros(p1 - p0, dtype=np.int64)
        if self.accesses >= n_acc:
            return counts + self.accesses
        while self.accesses < n_acc:
            seqs = self.acc.seqs(self.accesses, min(self.accesses + BATCH_ROWS, n_acc))
            k = int(np.searchsorted(seqs, p1 - 1, side="right"))
            if k:
                # seqs >= p0 here: the earlier ones went with earlier records
                counts += np.cumsum(np.bincount((seqs[:k] - p0).astype(np.int64),
                                                minlength=p1 - p0)[:p1 - p0])
                self.accesses += k
            if k < len(seqs):
                break
        self.acc.release(self.accesses)
        return counts + (self.accesses - int(counts[-1]) if len(counts) else 0)

    def close(self) -> None:
        self.writer.close()


class StoreWriter:
    """See the module docstring."""

    def __init__(self, directory: str):
        self.directory = directory
        self.followers: dict[int, RecordFollower] = {}
        os.makedirs(store_path(directory), exist_ok=True)
        write_store_meta(directory, {"complete": False})

    def write_records(self, progress=None) -> int:
        """The records table (every file complete).  Returns its rows."""
        from .columnar import Flushers, PartWriter
        flusher = Flushers()
        written = 0
        try:
            for tid, _path in CALL_RECORDS.files(self.directory):
                follower = self.followers[tid] = RecordFollower(self.directory, tid, flusher)
                while True:
                    n = follower.step()
                    if not n:
                        break
                    written += n
                    if progress is not None:
                        progress(written)
            for follower in self.followers.values():
                follower.close()
        finally:
            flusher.join()
        if not sum(f.writer.files for f in self.followers.values()):
            PartWriter(self.directory, "records", 0).ensure_file()
        return sum(f.writer.rows for f in self.followers.values())

    def _captured_events(self) -> int:
        """Call records and accesses: the accesses meta.json counted, else (a trace
        cut short) the access records of the compact blocks' headers, which count
        a read-modify-write once where it is two accesses."""
        records = CALL_RECORDS.total_rows(self.directory)
        try:
            counted = (read_meta(self.directory).get("accesses") or {}).values()
            accesses = sum(int(c["L"]) + int(c["S"]) for c in counted)
        except (CorruptTraceError, OSError, KeyError, TypeError, ValueError, AttributeError):
            accesses = 0
        if not accesses:
            accesses = sum(record_count(p) for _, p in ACCESS_RECORDS.files(self.directory))
        return records + accesses

    def finish(self, out=sys.stderr) -> dict:
        """Every file is complete: write the tables.  Returns the store's meta."""
        from .store_tables import write_final_tables
        records_total = CALL_RECORDS.total_rows(self.directory)
        progress = Progress("store: records", records_total, out)
        records = self.write_records(progress)
        progress.done()
        progress = Progress("store: calls and accesses", self._captured_events(), out)
        rows = write_final_tables(self.directory, progress)
        progress.done()
        rows["records"] = records
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
