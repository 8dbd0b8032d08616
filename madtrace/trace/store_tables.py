# SPDX-License-Identifier: GPL-2.0-or-later
"""The store's tables that are written when the recording ends: ``calls`` and
``accesses`` (one pass of the segmentation over the raw capture: each
thread's calls and its accesses with their call, named by naming.py),
``allocations`` (data/blocks.bin, trace/blocks.py) and ``sites`` (functions.json).
They need the whole replay, the final memory map and the allocation names,
so they are not written live (columnar.py has the layout)."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from .allocator_calls import AllocatorCalls
from .replay import FATES, segment_columns
from .compact import DATA_SUFFIX
from .segmentation import iter_thread_chunks, load_tables, thread_files
from .access_names import AccessDimensions
from .columnar import Flushers, PartWriter, dictionary_column
from .blocks import block_name, load_block_table
from .record_files import ACCESS_RECORDS
from .format import load_functions
from .naming import AccessNamer
from .store_block_events import BlockEventPlacer, block_event_columns, write_block_events

# rows per chunk of the segmentation pass: large enough that the per-chunk work is
# amortised, small enough that a chunk's access rows (48 bytes each) stay under
# glibc's largest threshold for mmap (32 MB): above it, every chunk's buffer came as
# new pages that the kernel zeroed (a fifth of the build of a trace with calls);
# below it, freed buffers are reused
CHUNK_ROWS = 1 << 19
# threads that encode and write Parquet parts side by side (the encoding is the
# store's largest cost: bench/bench_store_real.py)
WRITERS = 2


def records_columns(chunk) -> dict:
    """The records table's columns of a chunk of the segmentation: a record's
    place in its thread's merged stream (pos) counts the accesses before it,
    every one of which the replay gave out with it or before (an access with seq
    q lies between records q-1 and q)."""
    seq = chunk.record_start + np.arange(len(chunk.records), dtype=np.int64)
    before = chunk.access_start + np.searchsorted(chunk.accesses["seq"].astype(np.int64), seq,
                                                  side="right")
    r = chunk.records
    return {"pos": seq + before, "seq": seq, "tsc": r["tsc"], "code": r["code"], "rsp": r["rsp"]}


def calls_columns(segments: np.ndarray, names: list[str]) -> dict:
    columns = segment_columns(segments)
    columns["function"] = dictionary_column(columns["fid"], names)
    columns["fate"] = dictionary_column(columns["fate"], list(FATES))
    return columns


def _column(values: list, type_: pa.DataType) -> pa.Array:
    return pa.array(values, type=type_)


def write_allocations(directory: str, batch_rows: int = 1 << 18) -> int:
    """The allocations table from the block table, a batch of rows at a time."""
    table = load_block_table(directory)
    writer = PartWriter(directory, "allocations")
    kinds = np.array(table.kinds, dtype=object)
    sites = np.array(table.sites, dtype=object)
    for first in range(0, len(table), batch_rows):
        rows = np.asarray(table.rows[first:first + batch_rows])
        freed = rows["freed"] != 0
        names = [block_name(k, i, s, f) for k, i, s, f in zip(
            kinds[rows["kind"]].tolist(), rows["id"].tolist(), sites[rows["site"]].tolist(),
            freed.tolist())]

        def released(column, type_, rows=rows, freed=freed):
            return pa.array(rows[column], type=type_, mask=~freed)

        writer.write({"id": rows["id"], "kind": pa.array(kinds[rows["kind"]], type=pa.string()),
                      "name": pa.array(names, type=pa.string()), "address": rows["address"],
                      "size": rows["size"], "site": pa.array(sites[rows["site"]], type=pa.string()),
                      "tid": rows["tid"].astype(np.int32), "seq": rows["seq"].astype(np.int64),
                      "order": rows["order"],
                      "freed_seq": released("freed_seq", pa.int64()),
                      "freed_tid": released("freed_tid", pa.int32()),
                      "freed_order": released("freed_order", pa.uint64()),
                      "part_of": pa.array(rows["part_of"], type=pa.uint32(),
                                          mask=rows["part_of"] == 0)})
    writer.close()
    writer.ensure_file()
    return writer.rows


def write_sites(directory: str) -> int:
    writer = PartWriter(directory, "sites")
    doc = load_functions(directory)
    sites = doc.get("sites", []) if doc is not None else []
    if sites:
        writer.write({"site": _column([s["sid"] for s in sites], pa.int32()),
                      "function": _column([s["function"] for s in sites], pa.string()),
                      "kind": _column([s["kind"] for s in sites], pa.string()),
                      "address": _column([s.get("address") for s in sites], pa.uint64()),
                      "caller": _column([s.get("caller") for s in sites], pa.string())})
    writer.close()
    writer.ensure_file()
    return writer.rows


def write_final_tables(directory: str, progress=None) -> dict[str, int]:
    """records, calls, access rows and their names, functions, allocations, sites
    and block events; returns the rows of each.  ``progress(events_done)`` is called after
    each chunk.  What needs no access (the allocations and sites tables, the block
    events' names) is made on a thread of its own beside the pass: the pass is
    C and Parquet encoding, which leave the interpreter free."""
    tables = load_tables(directory, required=False)
    namer = AccessNamer(directory) if ACCESS_RECORDS.files(directory) else None
    dimensions = AccessDimensions(namer) if namer is not None else None
    placer = BlockEventPlacer(directory)
    rows = {"records": 0, "calls": 0, "access_rows": 0}
    beside = _Beside(lambda: (write_allocations(directory), write_sites(directory),
                              block_event_columns(directory, placer.rows, namer)))
    written: set[str] = set()      # tables with at least one file
    flusher = Flushers(WRITERS)
    try:
        _write_threads(directory, tables, dimensions, placer, flusher, rows, written, progress)
    finally:
        flusher.join()
        made = beside.join()
    for table in rows:
        if table not in written:
            PartWriter(directory, table, 0).ensure_file()
    rows.update(write_dimensions(directory, dimensions, tables.names))
    if dimensions is not None:
        dimensions.close()
    rows["allocations"], rows["sites"], event_columns = made
    rows["block_events"] = write_block_events(directory, namer, placer, event_columns)
    return rows


class _Beside:
    """``work()`` on a thread of its own; ``join()`` gives its answer or raises its error."""

    def __init__(self, work):
        self._answer: list = []
        self._error: list[BaseException] = []

        def run() -> None:
            try:
                self._answer.append(work())
            except BaseException as exc:     # raised by join()
                self._error.append(exc)

        self._thread = threading.Thread(target=run, name="madtrace-store-side", daemon=True)
        self._thread.start()

    def join(self):
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._answer[0]


def write_dimensions(directory: str, dimensions: AccessDimensions | None,
                     names: list[str]) -> dict[str, int]:
    """The names of the access rows' ids, and the function names of the fids."""
    out = {}
    tables: list[tuple[str, dict | None]] = [
        ("access_instructions", dimensions.new_instructions() if dimensions else None),
        ("access_data", dimensions.new_data() if dimensions else None),
        ("functions", {"fid": np.arange(len(names), dtype=np.int32), "function": names})]
    for table, columns in tables:
        writer = PartWriter(directory, table)
        if columns is not None and len(columns[writer.schema[0].name]):
            writer.write({f.name: columns[f.name] if isinstance(columns[f.name], np.ndarray)
                          else _column(columns[f.name], f.type) for f in writer.schema})
        writer.close()
        writer.ensure_file()
        out[table] = writer.rows
    return out


def _write_threads(directory, tables, dimensions, placer, flusher, rows, written,
                   progress) -> None:
    """records, calls and access rows of every thread, in one segmentation pass;
    the threads without call records (their accesses outside every call)
    straight from their compact files."""
    allocator_calls = AllocatorCalls.load(directory)
    with_records = {t for t, _ in thread_files(directory)}
    direct = {t: p for t, p in ACCESS_RECORDS.files(directory)
              if t not in with_records and p.endswith(DATA_SUFFIX)}
    done_before = 0
    for tid, path in sorted(direct.items()):
        writer = PartWriter(directory, "access_rows", tid, flusher)
        for columns in dimensions.row_chunks(path, allocator_calls.spans(tid), CHUNK_ROWS):
            placer.see(tid, columns["order"])
            writer.write(columns)
            done_before += len(columns["pos"])
            if progress is not None:
                progress(done_before)
        writer.close()
        rows["access_rows"] += writer.rows
        if writer.files:
            written.add("access_rows")
    writers: dict[str, PartWriter] = {}
    for chunk in iter_thread_chunks(directory, tables=tables, chunk_rows=CHUNK_ROWS,
                                    skip=set(direct)):
        if not writers:
            writers = {t: PartWriter(directory, t, chunk.tid, flusher) for t in rows}
        if len(chunk.records):
            writers["records"].write(records_columns(chunk))
        if len(chunk.segments):
            writers["calls"].write(calls_columns(chunk.segments, tables.names))
        if len(chunk.accesses):
            placer.see(chunk.tid, chunk.accesses["order"])
            writers["access_rows"].write(dimensions.rows(
                chunk.accesses, chunk.access_start, chunk.events,
                allocator_calls.spans(chunk.tid)))
        done = chunk.record_start + len(chunk.records) + chunk.access_start + len(chunk.accesses)
        if progress is not None:
            progress(done_before + done)
        if chunk.last:
            done_before += done
            for table, writer in writers.items():
                writer.close()
                rows[table] += writer.rows
                if writer.files:
                    written.add(table)
            writers = {}
