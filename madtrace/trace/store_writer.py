# SPDX-License-Identifier: GPL-2.0-or-later
"""StoreWriter: writes a trace's store (DIR/store, columnar.py) from its raw
capture, while the target runs and when it ends.

While the target runs, a background thread (niced, so that it never starves
the thread that drains the rings) follows ``calls/<tid>.rec`` as the drain
appends to it and writes the ``records`` table, in row groups of at least
``min_rows`` records.  A record's place in its thread's merged stream
(``pos``) counts the accesses before it, so with data tracing a record is
written once the accesses before it are in ``data/<tid>.acc``: the data
engine appends them in order, so every access with ``seq`` below the last
one on disk is there.  ``finish()`` (the target ended; every file is
complete) writes the rest of the records, then the tables that need the
whole replay (store_tables.py): calls, accesses, allocations, sites; then
``store/meta.json`` with ``"complete": true``.  Long finishes print their
progress on stderr.

``build_store(directory)`` does all of it after the fact (``--no-store``, a
REPL snapshot, a store left incomplete): ``ensure_store`` builds the store
on first use.  Memory stays bounded: one batch of ``BATCH_ROWS`` rows (and
the segmentation's chunks) at a time.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading

import numpy as np

from .record_files import SeqFollower, record_count
from ..progress import Progress
from .record_files import ACCESS_RECORDS, CALL_RECORDS
from .format import STORE_FORMAT_VERSION, load_functions, read_store_meta, store_path, write_store_meta
from .record_files import capture_sources, store_is_complete

BATCH_ROWS = 1 << 19
# events a recording converts before it ends; a longer conversion waits for first use
FINISH_AT_END_EVENTS = 1_000_000
LIVE_MIN_ROWS = 1 << 18
LIVE_INTERVAL = 0.25
NICE = 10




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

    def step(self, final: bool, accesses_possible, min_rows: int) -> int:
        """Write the next batch of records that can be placed; returns how many."""
        n_rec = CALL_RECORDS.rows(self.rec_path)
        n_acc = self.acc.count()
        limit = n_rec
        if not final and accesses_possible():      # asked after the sizes were read
            # every access with seq below the last one's is on disk
            limit = min(limit, self._seq_of(n_acc - 1) if n_acc else 0)
        p0 = self.records
        p1 = min(limit, p0 + BATCH_ROWS)
        if p1 <= p0 or (not final and p1 - p0 < min_rows):
            return 0
        records = CALL_RECORDS.read(self.rec_path, p0, p1 - p0)
        before = self._accesses_before(p0, p1, n_acc)
        seq = np.arange(p0, p1, dtype=np.int64)
        self.writer.write({"pos": seq + before, "seq": seq, "tsc": records["tsc"],
                           "code": records["code"], "rsp": records["rsp"]})
        self.records = p1
        return p1 - p0

    def _seq_of(self, index: int) -> int:
        return self.acc.seq_at(index)

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
    """See the module docstring.  ``accesses_possible()``: whether data
    accesses may still be recorded (data tracing is or was on); ``busy()``:
    records pour in, and the tracer's drain needs the CPU and the GIL: the
    live pass waits (pyarrow's import holds the GIL 10-35 ms at a time, longer
    than a ring takes to fill at full speed, ~3 ms)."""

    def __init__(self, directory: str, accesses_possible=None, live_min_rows: int = LIVE_MIN_ROWS,
                 interval: float = LIVE_INTERVAL, defer_above: int | None = None, busy=None):
        self.directory = directory
        self.busy = busy or (lambda: False)
        # a store of more events than this is left to its first use (see finish)
        self.defer_above = defer_above
        self.accesses_possible = accesses_possible or (lambda: False)
        self.live_min_rows = live_min_rows
        self.interval = interval
        self.followers: dict[int, RecordFollower] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flusher = None
        self.live_rows = 0
        os.makedirs(store_path(directory), exist_ok=True)
        write_store_meta(directory, {"complete": False})

    # ------------------------------------------------------------------ live
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="madtrace-store", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except OSError:
            pass
        while not self._stop.wait(self.interval):
            if self.busy():
                continue
            if self.defer_above is not None and self._captured_events() > self.defer_above:
                return      # the store will be built on first use: leave the CPU to the target
            try:
                if self._flusher is None:
                    # pyarrow is imported here, once there is something to write
                    from .columnar import Flusher
                    self._flusher = Flusher(nice=NICE)
                self.live_rows += self._pass(final=False)
            except BaseException as exc:    # reported by finish(), which rebuilds
                self.error = exc
                return

    def _pass(self, final: bool, progress=None) -> int:
        written = 0
        for tid, _path in CALL_RECORDS.files(self.directory):
            follower = self.followers.get(tid)
            if follower is None:
                follower = self.followers[tid] = RecordFollower(self.directory, tid,
                                                                self._flusher)
            while not self._stop.is_set() or final:
                if not final and self.busy():
                    return written      # a burst began: the next pass goes on from here
                n = follower.step(final, self.accesses_possible, self.live_min_rows)
                if not n:
                    break
                written += n
                if progress is not None:
                    progress(written)
        return written

    # ---------------------------------------------------------------- finish
    def write_records(self, progress=None) -> int:
        """The records not written yet (every file complete); closes the
        records table.  Returns its rows."""
        from .columnar import Flusher, PartWriter
        if self._flusher is None:
            self._flusher = Flusher()
        try:
            self._pass(final=True, progress=progress)
            for follower in self.followers.values():
                follower.close()
        finally:
            self._flusher.join()
            self._flusher = None
        if not sum(f.writer.files for f in self.followers.values()):
            PartWriter(self.directory, "records", 0).ensure_file()
        return sum(f.writer.rows for f in self.followers.values())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _captured_events(self) -> int:
        # compact files: their access records from the block headers (a cheap estimate)
        return CALL_RECORDS.total_rows(self.directory) + \
            sum(record_count(p) for _, p in ACCESS_RECORDS.files(self.directory))

    def finish(self, out=sys.stderr) -> dict:
        """Every file is complete: write the rest, then the final tables.
        Returns the store's meta.  With ``defer_above``, a store of more events
        than that is left incomplete (the first query, export, report or
        summary that needs it builds it), so that a recording of tens of
        millions of calls ends when its target does, as the capture itself
        does; the live writer stops following such a capture as soon as it
        grows past that size (its work would be rebuilt anyway)."""
        defer_above = self.defer_above
        from .store_tables import write_final_tables
        self.stop()
        if self.error is not None:
            if out is not None:
                print(f"madtrace: store: writing while the target ran failed ({self.error}); "
                      "writing it again", file=out, flush=True)
            return build_store(self.directory, out)
        records_total = CALL_RECORDS.total_rows(self.directory)
        pending = records_total - sum(f.records for f in self.followers.values())
        total = self._captured_events()
        if defer_above is not None and total > defer_above:
            # what was written live is dropped: the first use rebuilds the whole store
            if self._flusher is not None:
                flusher, self._flusher = self._flusher, None
                try:
                    flusher.join()
                except Exception:       # noqa: BLE001 - the store is rebuilt anyway
                    pass
            write_store_meta(self.directory, {"complete": False, "deferred_events": total,
                                              "records_written_live": self.live_rows})
            if out is not None:
                print(f"madtrace: store: {total} events, more than the {defer_above} converted "
                      f"when a recording ends: the first query, export, report or summary of "
                      f"{self.directory} builds the store", file=out, flush=True)
            return read_store_meta(self.directory)
        progress = Progress("store: records", pending, out)
        records = self.write_records(progress)
        progress.done()
        progress = Progress("store: calls and accesses", total, out)
        rows = write_final_tables(self.directory, progress)
        progress.done()
        rows["records"] = records
        meta = {"complete": True, "rows": rows, "records_written_live": self.live_rows,
                "written_live": ["records"],
                "written_at_end": ["calls", "accesses", "allocations", "sites"]}
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
