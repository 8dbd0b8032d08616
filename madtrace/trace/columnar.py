# SPDX-License-Identifier: GPL-2.0-or-later
"""The trace store's files: Parquet tables under ``DIR/store/`` (format below),
their schemas and writers.  StoreWriter (store_writer.py) fills them; query.py
reads them with DuckDB.

Layout (``format.STORE_FORMAT_VERSION`` 2)::

  store/meta.json                 {"format_version": 2, "complete": true|false,
                                   "tables": {name: {"rows": n, "files": n}},
                                   "tsc_hz": ..., "written_live": [...], ...}
  store/records/tid=<tid>/p<n>.parquet     call records          (written live)
  store/calls/tid=<tid>/p<n>.parquet       dynamic calls         (at the end)
  store/accesses/tid=<tid>/p<n>.parquet    data accesses, named  (at the end)
  store/allocations/p0.parquet             heap blocks           (at the end)
  store/sites/p0.parquet                   call sites            (at the end)

The per-thread tables are partitioned by thread the Hive way (``tid=N``
folders; the files themselves have no tid column): DuckDB
(``hive_partitioning``), Spark, Trino and pyarrow.dataset read the tid from
the folder names.  A table with no rows has one empty file (in ``tid=0``
for the per-thread ones), so that its schema is known.

Every file is Parquet, zstd level 1, row groups of at most ``ROW_GROUP_ROWS``
rows, a new part every ``PART_ROWS`` rows.  The two largest tables (access rows,
call records: integer columns only) are written by the store's own writer
(parquet_file.py): DELTA_BINARY_PACKED for the (nearly) sorted columns and the
access flags, PLAIN for the others.  The other tables by pyarrow's:
DELTA_BINARY_PACKED integer columns (the positions, sequence numbers and
timestamps are nearly sorted), dictionary-encoded strings and record codes.
Min/max statistics on the key columns (tid, pos, seq, call ids).  Files of one
table share one schema, so any Parquet reader (DuckDB, Spark, Trino, pandas)
reads the folder as one table.  A store whose meta.json is missing, incomplete or of
another version is rebuilt from the raw capture when it is needed.
"""

from __future__ import annotations

import os
import queue
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .format import store_path
from .parquet_file import ParquetFileWriter, RowGroupEncoder

ROW_GROUP_ROWS = 1 << 20
PART_ROWS = 8 << 20
FLUSH_ROWS = 1 << 18       # rows buffered before a row group is written

_dict = pa.dictionary(pa.int32(), pa.string())

SCHEMAS: dict[str, pa.Schema] = {
    # one row per call record, in each thread's order; pos: its place in the
    # thread's merged stream of records and accesses (the events view)
    "records": pa.schema([("pos", pa.int64()), ("seq", pa.int64()), ("tsc", pa.uint64()),
                          ("code", pa.uint32()), ("rsp", pa.uint32())]),
    "calls": pa.schema([
        ("call_id", pa.int64()), ("function", _dict), ("fid", pa.int32()),
        ("parent_id", pa.int64()), ("depth", pa.int32()), ("fate", _dict), ("outermost", pa.bool_()),
        ("begin_seq", pa.int64()), ("end_seq", pa.int64()), ("begin_pos", pa.int64()),
        ("end_pos", pa.int64()), ("begin_tsc", pa.uint64()), ("end_tsc", pa.uint64()),
        ("accesses_self", pa.int64()), ("accesses_incl", pa.int64()),
        ("bytes_self", pa.int64()), ("bytes_incl", pa.int64())]),
    # one row per data access: ids and numbers; the names are in the two tables
    # after it (access_names.py) and the accesses view joins them (query.py)
    "access_rows": pa.schema([
        ("pos", pa.int64()), ("seq", pa.int64()), ("order", pa.uint64()), ("call_id", pa.int64()),
        ("fid", pa.int32()), ("iid", pa.uint32()), ("did", pa.uint32()), ("addr", pa.uint64()),
        ("flags", pa.uint8())]),
    "access_instructions": pa.schema([("iid", pa.uint32()), ("rip", pa.uint64()),
                                      ("size", pa.uint16()), ("instruction", pa.string())]),
    "access_data": pa.schema([("did", pa.uint32()), ("symbol", pa.string()),
                              ("variable", pa.string()), ("region", pa.string()),
                              ("base", pa.uint64()), ("block", pa.uint32()),
                              ("freed", pa.bool_())]),
    "functions": pa.schema([("fid", pa.int32()), ("function", pa.string())]),
    "allocations": pa.schema([
        ("id", pa.uint32()), ("kind", pa.string()), ("name", pa.string()),
        ("address", pa.uint64()), ("size", pa.uint64()), ("site", pa.string()),
        ("tid", pa.int32()), ("seq", pa.int64()), ("order", pa.uint64()),
        ("freed_seq", pa.int64()), ("freed_tid", pa.int32()), ("freed_order", pa.uint64()),
        ("part_of", pa.uint32())]),
    "block_events": pa.schema([
        ("tid", pa.int32()), ("pos", pa.int64()), ("seq", pa.int64()), ("order", pa.uint64()),
        ("kind", pa.string()), ("what", pa.string()), ("rip", pa.uint64()),
        ("instruction", pa.string()), ("addr", pa.uint64()), ("size", pa.uint64()),
        ("source", pa.uint64()), ("data", pa.string()), ("source_data", pa.string())]),
    "sites": pa.schema([("site", pa.int32()), ("function", pa.string()), ("kind", pa.string()),
                        ("address", pa.uint64()), ("caller", pa.string())]),
}
TABLES = tuple(SCHEMAS)
PER_THREAD = ("records", "calls", "access_rows")
# access_rows.flags
FLAG_STORE, FLAG_FIRST, FLAG_ALLOCATOR = 1, 2, 4
# integer columns that are (nearly) sorted: delta-encoded; the others plain or dictionary
_DELTA = {"pos", "seq", "tsc", "call_id", "parent_id", "begin_seq", "end_seq", "begin_pos",
          "end_pos", "begin_tsc", "end_tsc", "order", "tid", "depth",
          "accesses_self", "accesses_incl", "bytes_self", "bytes_incl",
          "id", "address", "size", "freed_seq", "freed_tid", "freed_order", "part_of", "site",
          "rip", "block"}
# the tables of integer columns only, written by the store's own writer (parquet_file.py):
# the two largest, at two to three times pyarrow's rate (bench/bench_store.py)
_OWN_WRITER = {"access_rows", "records"}
# and delta-encoded there too: small codes whose deltas pack in a few bits (the access
# flags: 0.06 bytes per row against 0.2 plain, in the same time)
_OWN_DELTA = {"flags"}
# min/max statistics (row-group pruning) only where queries filter; they cost ~40% of the
# writing time when kept for every column
_STATS = {"tid", "pos", "seq", "call_id", "begin_pos", "end_pos", "begin_seq", "end_seq", "id"}


def _options(schema: pa.Schema) -> dict:
    encoding, dictionary = {}, []
    for f in schema:
        if pa.types.is_dictionary(f.type):
            dictionary.append(f.name)
        elif pa.types.is_integer(f.type) and f.name in _DELTA:
            encoding[f.name] = "DELTA_BINARY_PACKED"
        elif pa.types.is_string(f.type):
            dictionary.append(f.name)
    return dict(compression="zstd", compression_level=1, use_dictionary=dictionary,
                column_encoding=encoding or None,
                write_statistics=[f.name for f in schema if f.name in _STATS])


class Flusher:
    """One background thread that encodes and writes row groups (pyarrow
    releases the GIL while it does), in the order they were handed over, so
    that the next batch is prepared meanwhile.  At most ``depth`` batches
    wait: memory stays bounded.  ``join()`` waits for all and raises the
    first error."""

    def __init__(self, depth: int = 2, nice: int | None = None):
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.nice = nice
        self.thread = threading.Thread(target=self._run, name="madtrace-store-io", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.nice is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except OSError:
                pass
        while True:
            task = self.queue.get()
            if task is None:
                return
            if self.error is None:
                try:
                    task()
                except BaseException as exc:   # raised by submit() or join()
                    self.error = exc
            else:           # skipped: a task that others wait for lets them go
                abandon = getattr(task, "abandon", None)
                if abandon is not None:
                    abandon()

    def submit(self, task) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(task)

    def join(self) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error

    def pick(self, part: int) -> "Flusher":
        """The flusher of a table's part ``part``: this one."""
        return self


class Flushers:
    """``count`` flushers; a table's parts (or, for the store's own writer, its
    row groups: ``_InTurn``) go to them in turn, so that they are encoded and
    written in parallel."""

    def __init__(self, count: int = 2, depth: int = 2, nice: int | None = None):
        self.flushers = [Flusher(depth, nice) for _ in range(max(count, 1))]

    def pick(self, part: int) -> Flusher:
        return self.flushers[part % len(self.flushers)]

    def join(self) -> None:
        errors = []
        for flusher in self.flushers:
            try:
                flusher.join()
            except BaseException as exc:     # every thread joined, then the first error
                errors.append(exc)
        if errors:
            raise errors[0]


class _Inline:
    """Runs each task at once (no background thread)."""

    @staticmethod
    def submit(task) -> None:
        task()

    @classmethod
    def pick(cls, part: int):
        return cls


class _ArrowBatches:
    """A table's rows as pyarrow tables, written by pyarrow's Parquet writer: a
    part's row groups on one flusher, in order."""

    parallel = False

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.options = _options(schema)

    def batch(self, columns: dict) -> pa.Table:
        return pa.table([columns[f.name] if isinstance(columns[f.name], pa.Array)
                         else pa.array(columns[f.name], type=f.type) for f in self.schema],
                        schema=self.schema)

    @staticmethod
    def rows(batch: pa.Table) -> int:
        return batch.num_rows

    @staticmethod
    def concat(batches: list) -> pa.Table:
        return batches[0] if len(batches) == 1 else \
            pa.concat_tables(batches, promote_options="none").unify_dictionaries()

    @staticmethod
    def slice(batch: pa.Table, first: int, count: int) -> pa.Table:
        return batch.slice(first, count)

    def open(self, path: str):
        return pq.ParquetWriter(path, self.schema, **self.options)

    @staticmethod
    def prepare(piece: pa.Table) -> pa.Table:
        return piece            # pyarrow encodes as it writes

    @staticmethod
    def append(writer, piece: pa.Table) -> None:
        writer.write_table(piece, row_group_size=ROW_GROUP_ROWS)


class _NumpyBatches:
    """A table of integer columns as numpy arrays, written by the store's own
    Parquet writer (parquet_file.py) with the encodings and statistics that
    ``_options`` gives pyarrow's.  Its row groups are encoded on any flusher,
    side by side, and appended to their part in order (``parallel``)."""

    parallel = True

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.dtypes = {f.name: np.dtype(f.type.to_pandas_dtype()) for f in schema}
        self.encoder = RowGroupEncoder(
            schema, {f.name: "DELTA_BINARY_PACKED" for f in schema
                     if f.name in _DELTA or f.name in _OWN_DELTA},
            {f.name for f in schema if f.name in _STATS})

    def batch(self, columns: dict) -> list[dict]:
        """A batch: a list of pieces, each a dict of equally long columns (gathered
        and cut without copying them: a row group's pages follow its pieces)."""
        return [{name: np.asarray(columns[name].to_numpy(zero_copy_only=False)
                                  if isinstance(columns[name], pa.Array) else columns[name],
                                  dtype=dtype) for name, dtype in self.dtypes.items()}]

    def rows(self, batch: list[dict]) -> int:
        first = self.schema[0].name
        return sum(len(piece[first]) for piece in batch)

    @staticmethod
    def concat(batches: list) -> list[dict]:
        return [piece for batch in batches for piece in batch]

    def slice(self, batch: list[dict], first: int, count: int) -> list[dict]:
        out, at, name = [], 0, self.schema[0].name
        for piece in batch:
            n = len(piece[name])
            lo, hi = max(first - at, 0), min(first + count - at, n)
            if lo < hi:
                out.append({c: v[lo:hi] for c, v in piece.items()})
            at += n
        return out

    def open(self, path: str) -> ParquetFileWriter:
        return ParquetFileWriter(path, self.encoder)

    def prepare(self, piece: dict):
        return self.encoder.encode(piece)

    @staticmethod
    def append(writer: ParquetFileWriter, encoded) -> None:
        writer.append(encoded)


class _Turns:
    """Steps that run in the order of their tickets, on whichever thread comes to
    them: a flusher that encoded row group k + 1 first waits to append it until
    row group k is in the file.  A step that fails (or whose task was skipped)
    lets every later one go, with its error (a full disk is said as one, whichever
    flusher meets it first)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._issued = 0
        self._next = 0
        self._broken = False
        self._cause: BaseException | None = None

    def ticket(self) -> int:
        self._issued += 1
        return self._issued - 1

    def run(self, ticket: int, step) -> None:
        with self._cond:
            while self._next != ticket and not self._broken:
                self._cond.wait()
            if self._broken:
                raise self._cause or RuntimeError("an earlier row group of this part was "
                                                  "not written")
        try:
            step()
        except BaseException as exc:
            self.abandon(exc)
            raise
        with self._cond:
            self._next += 1
            self._cond.notify_all()

    def abandon(self, cause: BaseException | None = None) -> None:
        with self._cond:
            self._broken = True
            self._cause = self._cause or cause
            self._cond.notify_all()


class _InTurn:
    """A flusher's task: ``prepare()`` (the encoding, side by side with the other
    flushers'), then ``step(prepared)`` in its turn."""

    def __init__(self, turns: _Turns, ticket: int, step, prepare=None):
        self.turns, self.ticket, self.step, self.prepare = turns, ticket, step, prepare

    def __call__(self) -> None:
        try:
            prepared = self.prepare() if self.prepare is not None else None
        except BaseException as exc:
            self.turns.abandon(exc)
            raise
        self.turns.run(self.ticket, lambda: self.step(prepared))

    def abandon(self) -> None:
        self.turns.abandon()


class PartWriter:
    """Appends row groups to ``store/<table>/[tid=<tid>/]p<n>.parquet``, starting a
    new part every PART_ROWS rows; small writes are gathered into row groups
    of at least FLUSH_ROWS rows.  ``close()`` writes what is buffered and
    finishes the open part.  With a ``flusher``, encoding and writing happen
    on its threads (call ``flusher.join()`` before reading the files)."""

    def __init__(self, directory: str, table: str, tid: int | None = None,
                 flusher: Flusher | Flushers | None = None):
        self.folder = store_path(directory, table) if tid is None else \
            store_path(directory, table, f"tid={tid}")
        os.makedirs(self.folder, exist_ok=True)
        self.table = table
        self.schema = SCHEMAS[table]
        self.batches = (_NumpyBatches if table in _OWN_WRITER else _ArrowBatches)(self.schema)
        self.flusher = flusher or _Inline
        self._turns = _Turns()
        self._state: dict = {"writer": None}     # the open part's writer
        self.part = 0
        self.part_rows = 0
        self.rows = 0
        self.files = 0
        self.pending: list = []
        self.pending_rows = 0

    def write(self, columns: dict) -> None:
        """``columns``: name -> numpy array or pyarrow array (every schema column)."""
        batch = self.batches.batch(columns)
        self.pending.append(batch)
        self.pending_rows += self.batches.rows(batch)
        if self.pending_rows >= FLUSH_ROWS:
            self.flush()

    def _submit(self, step, prepare=None) -> None:
        """``step(prepare())`` on a flusher, in the order submitted for this table:
        pyarrow's parts each on one flusher; the own writer's row groups
        prepared (encoded) on any, appended in turn."""
        if not self.batches.parallel:
            self.flusher.pick(self.part).submit(
                lambda: step(prepare() if prepare is not None else None))
            return
        ticket = self._turns.ticket()
        self.flusher.pick(ticket).submit(_InTurn(self._turns, ticket, step, prepare))

    def flush(self) -> None:
        if not self.pending:
            return
        batches = self.batches
        batch = batches.concat(self.pending)
        self.pending, self.pending_rows = [], 0
        n = batches.rows(batch)
        done = 0
        while done < n or self.files == 0:
            if self.part_rows == 0:
                path = os.path.join(self.folder, f"p{self.part}.parquet")
                # each part its own writer
                self._state = {"writer": None}
                self._submit(lambda _, path=path, state=self._state: self._open(path, state))
                self.files += 1
            take = min(n - done, PART_ROWS - self.part_rows, ROW_GROUP_ROWS)
            piece = batches.slice(batch, done, take)
            self._submit(lambda prepared, state=self._state: batches.append(state["writer"],
                                                                            prepared),
                         lambda piece=piece: batches.prepare(piece))
            done += take
            self.part_rows += take
            self.rows += take
            if self.part_rows >= PART_ROWS:
                self._submit(lambda _, state=self._state: self._close_part(state))
                self.part += 1
                self.part_rows = 0
            if n == 0:
                break

    def _open(self, path: str, state: dict) -> None:
        state["writer"] = self.batches.open(path)

    def close(self) -> None:
        self.flush()
        if self.part_rows:
            self._submit(lambda _, state=self._state: self._close_part(state))
            self.part += 1
            self.part_rows = 0

    @staticmethod
    def _close_part(state: dict) -> None:
        if state["writer"] is not None:
            state["writer"].close()
            state["writer"] = None

    def ensure_file(self) -> None:
        """A table with no rows still gets one (empty) file: readers see its schema."""
        if self.files == 0:
            self.write({f.name: pa.array([], type=f.type) for f in self.schema})
            self.flush()
            self._submit(lambda _, state=self._state: self._close_part(state))


def dictionary_column(codes, names: list[str]) -> pa.DictionaryArray:
    """A string column from int codes into ``names`` (negative codes: null)."""
    codes = np.asarray(codes, dtype=np.int32)
    mask = codes < 0
    indices = pa.array(np.where(mask, 0, codes), type=pa.int32(),
                       mask=mask if mask.any() else None)
    return pa.DictionaryArray.from_arrays(indices, pa.array(names or [""], type=pa.string()))
