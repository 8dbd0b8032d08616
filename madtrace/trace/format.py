# SPDX-License-Identifier: GPL-2.0-or-later
"""The trace format: what a recording leaves on disk, defined once.

The contract between the two sides of madtrace: the tracer (capture/,
inject/, session.py) writes a trace directory with these names and layouts,
the offline side (trace/, analysis/, report/, export/, query) reads it back
through them.  Nothing else defines a record layout, a file name of a trace
directory or the page size; this module imports nothing but numpy and
madtrace.errors, so that both sides can stand on it.

A trace directory (``FORMAT_VERSION`` 1, in meta.json)::

  meta.json               META_FILE         read_meta / write_meta
  maps.start.txt          MAPS_START_FILE   /proc/PID/maps when tracing began
  maps.end.txt            MAPS_END_FILE     ... when it ended (or at a snapshot);
                                            last_maps_text() reads the later one
  functions.json          FUNCTIONS_FILE    load_functions: sites, functions, clock
  calls/<tid>.rec         CALL_RECORDS      RECORD_DTYPE, 16 bytes a record
  data/<tid>.acc          ACCESS_RECORDS    ACCESS_DTYPE, 48 bytes an access (fault engine)
  data/<tid>.dat          ACCESS_RECORDS    compact access records in zstd blocks (hybrid
                                            engine: COMPACT_DTYPE, COMPACT_BLOCK_HEADER;
                                            trace/compact.py decodes them to ACCESS_DTYPE)
  data/instructions.jsonl INSTRUCTIONS_FILE the instructions the compact records name,
                                            one JSON line each, appended before any
                                            record names them (trace/compact.py)
  data/blocks.bin         BLOCKS_FILE       BLOCK_DTYPE, 72 bytes a heap block
  data/blocks.sites       BLOCK_SITES_FILE  the blocks' call sites, one JSON string a line
                                            (trace/blocks.py reads and writes both)
  data/allocations.json   ALLOCATIONS_FILE  load_allocations_json: the heap blocks
                                            of traces older than blocks.bin
  data/block_events.json  BLOCK_EVENTS_FILE load_block_events: memcpy/memset/syscalls
  data/numa.json          NUMA_FILE         load_numa: nodes, thread masks, page nodes
  data/allocator_calls.bin ALLOCATOR_CALLS_FILE  ALLOCATOR_CALL_DTYPE, 24 bytes a call
                                            of the allocator (trace/allocator_calls.py)
  store/                  STORE_DIR         the columnar store (Parquet tables:
                                            trace/columnar.py has their schemas)
  store/meta.json         STORE_META_FILE   read_store_meta / write_store_meta

The README's "The trace directory" describes every field.

Record files
------------
Each per-thread binary file is described by one :class:`RecordFile` (its
folder, extension and dtype), and every reader and writer goes through it:
``files(directory)`` lists (tid, path), ``path(directory, tid)`` names one,
``rows(path)``, ``chunks(path, n)``, ``read(path, start, count)`` and
``map(path)`` read it.  Nobody else computes a record's offset or a file's
row count.  That is what makes the format extensible in one place:

* **A new record kind** (e.g. compact access records written by the target
  into its ring): a dtype and a ``RecordFile`` here (a new folder or
  extension), added to ``RECORD_FILES``; readers that should see it iterate
  ``RECORD_FILES`` or ask for it by name.  If it replaces an existing kind,
  ``RecordFile.chunks`` is where old files are converted on the fly.
* **A header** (magic, format version, record size) at the start of each
  record file: give ``RecordFile`` a ``header`` (a ``struct.Struct``) and a
  ``create(path)`` that writes it; ``rows``/``chunks``/``read``/``map``
  then skip it (one offset) and check it (one place raising
  CorruptTraceError), and the writers (capture/rings.py opens
  ``calls/<tid>.rec``, capture/data.py appends to ``data/<tid>.acc``) call
  ``create`` when they open a new file.  A file without the header is a
  version-1 file: bump ``FORMAT_VERSION``.
* **Per-chunk checksums**: written by the same writers after each chunk
  (the ring drain writes 1 MiB at a time); ``chunks`` verifies them, and
  ``rows``/``read`` account for their bytes.  Both live in ``RecordFile``.

JSON files
----------
Each JSON file of a trace directory has one loader here, which raises
CorruptTraceError (exit code 18) with the file's path for anything that is
not what the writer wrote; what the analyses make of a file stays with
them.  Writers keep their encodings (meta.json is indented and sorted,
the data/ lists are compact) but name their files with these constants.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import CorruptTraceError, writing

FORMAT_VERSION = 1  # of the trace directory (meta.json format_version)
STORE_FORMAT_VERSION = 2  # of the store (store/meta.json format_version); 2: accesses.allocator, block_events

PAGE_SHIFT = 12
PAGE = 1 << PAGE_SHIFT  # the unit of protection, heat maps and page footprints

# ---------------------------------------------------------------- file names
META_FILE = "meta.json"
MAPS_START_FILE = "maps.start.txt"
MAPS_END_FILE = "maps.end.txt"
FUNCTIONS_FILE = "functions.json"
CALLS_DIR = "calls"
DATA_DIR = "data"
STORE_DIR = "store"
BLOCKS_FILE = f"{DATA_DIR}/blocks.bin"
BLOCK_SITES_FILE = f"{DATA_DIR}/blocks.sites"
ALLOCATIONS_FILE = f"{DATA_DIR}/allocations.json"  # the block list of older traces
BLOCK_EVENTS_FILE = f"{DATA_DIR}/block_events.json"
NUMA_FILE = f"{DATA_DIR}/numa.json"
ALLOCATOR_CALLS_FILE = f"{DATA_DIR}/allocator_calls.bin"
INSTRUCTIONS_FILE = f"{DATA_DIR}/instructions.jsonl"  # of the compact access records
INSTRUCTIONS_FILE_V1 = f"{DATA_DIR}/instructions.json"  # ... as traces of format 1 wrote it
STORE_META_FILE = f"{STORE_DIR}/meta.json"
EXEC_DIR_PREFIX = "exec."  # exec.<n>: the trace of the n-th image the process exec'd
FORK_DIR_PREFIX = "fork."  # fork.<pid>: the trace of a fork child followed


def exec_dir(directory: str, number: int) -> str:
    return os.path.join(directory, f"{EXEC_DIR_PREFIX}{number}")


def fork_dir(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{FORK_DIR_PREFIX}{pid}")


# ------------------------------------------------------------------- records
# A call record (calls/<tid>.rec), as the trampolines write it into the ring
# (injector/layout.h) and the drain copies it out: the TSC (0 with --no-time);
# code = site id << 1 | 1 for an exit record; the low 32 bits of the callee's
# stack pointer at entry (closes frames left by longjmp and tail calls).
RECORD_DTYPE = np.dtype([("tsc", "<u8"), ("code", "<u4"), ("rsp", "<u4")])
# how functions.json describes it (a reader of the files without madtrace)
RECORD_FORMAT = {
    "size": RECORD_DTYPE.itemsize,
    "fields": ["tsc:u64", "code:u32", "rsp_low32:u32"],
    "code": "site id << 1 | 1 for exit records",
}

# A data access (data/<tid>.acc): seq = call records the thread had written
# before it (the access lies between its records seq-1 and seq); order = the
# tracer's event counter, shared with allocation events (a total order of
# what the tracer saw); rip, addr; block = allocation id (0: none); size;
# kind (KIND_LOAD, KIND_STORE); freed = the block was already freed; ilen =
# the instruction's length; first = the first access of one execution of it.
ACCESS_DTYPE = np.dtype(
    [
        ("seq", "<u8"),
        ("order", "<u8"),
        ("rip", "<u8"),
        ("addr", "<u8"),
        ("block", "<u4"),
        ("size", "<u2"),
        ("kind", "u1"),
        ("freed", "u1"),
        ("ilen", "u1"),
        ("first", "u1"),
        ("pad", "u1", 6),
    ]
)
ACCESS_FIELDS = ("seq", "order", "rip", "addr", "block", "size", "kind", "freed", "ilen", "first")
KIND_LOAD, KIND_STORE = 1, 2


# A heap block (data/blocks.bin, row N-1 = block id N; trace/blocks.py): the
# allocation tracker appends a row when the block is allocated and writes the
# release fields (freed .. freed_order, contiguous: one write) in place when it
# is freed, and part_of when an operator new wraps it.  kind indexes BLOCK_KINDS,
# site the lines of data/blocks.sites.
BLOCK_DTYPE = np.dtype(
    {
        "names": [
            "id",
            "tid",
            "site",
            "part_of",
            "address",
            "size",
            "seq",
            "order",
            "kind",
            "freed",
            "freed_tid",
            "freed_seq",
            "freed_order",
        ],
        "formats": ["<u4", "<u4", "<u4", "<u4", "<u8", "<u8", "<u8", "<u8", "u1", "u1", "<u4", "<u8", "<u8"],
        "offsets": [0, 4, 8, 12, 16, 24, 32, 40, 48, 49, 52, 56, 64],
        "itemsize": 72,
    }
)
BLOCK_RELEASE_OFFSET = 49  # freed, pad, freed_tid, freed_seq, freed_order
BLOCK_RELEASE_DTYPE = np.dtype(
    {
        "names": ["freed", "freed_tid", "freed_seq", "freed_order"],
        "formats": ["u1", "<u4", "<u8", "<u8"],
        "offsets": [0, 3, 7, 15],
        "itemsize": 23,
    }
)
BLOCK_PART_OF_OFFSET = 12
BLOCK_KINDS = ("malloc", "calloc", "realloc", "new", "memmap", "mremap")


# An allocator call (data/allocator_calls.bin, trace/allocator_calls.py): the
# thread and the tracer's event order at the call's entry and at its return
# (end = ALLOCATOR_CALL_OPEN: still running when the recording ended).
ALLOCATOR_CALL_DTYPE = np.dtype([("tid", "<u4"), ("pad", "<u4"), ("begin", "<u8"), ("end", "<u8")])
ALLOCATOR_CALL_OPEN = np.iinfo(np.uint64).max


# Compact access records (data/<tid>.dat, the hybrid data engine; trace/compact.py
# decodes them).  The file is a sequence of blocks, one per batch the tracer
# drained: a COMPACT_BLOCK_HEADER (magic COMPACT_MAGIC "MTZ1", the records'
# bytes, the block's bytes after the header, the records), then the records
# compressed with COMPACT_CODEC (one frame).  A record: ``a`` (u64), ``id``
# (u32), ``b`` (u32).  id != 0: an access: a = the address, id = a row of
# data/instructions.jsonl (rip, size, kind 1 load / 2 store / 3 both, ilen,
# first, path), b = the heap block id, COMPACT_FREED_BIT set when it was
# already freed.  id == 0: a marker: b = COMPACT_MARK_SEQ: the records that
# follow have seq a; b = COMPACT_MARK_ORDER: the next access row has order a.
COMPACT_DTYPE = np.dtype([("a", "<u8"), ("id", "<u4"), ("b", "<u4")])
COMPACT_BLOCK_HEADER = np.dtype([("magic", "<u4"), ("raw", "<u4"), ("packed", "<u4"), ("records", "<u4")])
COMPACT_MAGIC = 0x315A544D  # "MTZ1"
COMPACT_CODEC = "zstd"
COMPACT_EXTENSION = ".dat"
COMPACT_MARK_SEQ, COMPACT_MARK_ORDER = 1, 2
COMPACT_FREED_BIT = 1 << 31
# data/instructions.jsonl: a first line {"format", "kinds", "columns"}, then one
# JSON array a line (the rows, from id 0; each line ends in a newline), appended as
# ids are given; an incomplete last line is being written (format 1: one JSON
# object with "rows", data/instructions.json, written at the end)
INSTRUCTIONS_FORMAT = 2
INSTRUCTION_COLUMNS = ("rip", "size", "kind", "ilen", "first", "path")


@dataclass(frozen=True)
class RecordFile:
    """One kind of per-thread record file: ``<folder>/<tid><extension>``
    holding ``dtype`` records back to back (see the module docstring)."""

    folder: str
    extension: str
    dtype: np.dtype

    def path(self, directory: str, tid: int) -> str:
        return os.path.join(directory, self.folder, f"{tid}{self.extension}")

    def files(self, directory: str) -> list[tuple[int, str]]:
        """(tid, path) of every file of this kind in a trace directory, by tid."""
        folder = os.path.join(directory, self.folder)
        if not os.path.isdir(folder):
            return []
        found = []
        for name in os.listdir(folder):
            stem, ext = os.path.splitext(name)
            if ext == self.extension and stem.isdigit():
                found.append((int(stem), os.path.join(folder, name)))
        return sorted(found)

    def rows(self, path: str) -> int:
        """Whole records in the file (0 if it does not exist)."""
        try:
            return os.path.getsize(path) // self.dtype.itemsize
        except OSError:
            return 0

    def total_rows(self, directory: str) -> int:
        return sum(self.rows(path) for _, path in self.files(directory))

    def chunks(self, path: str, chunk_rows: int) -> Iterator[np.ndarray]:
        """The records in order, ``chunk_rows`` at a time; CorruptTraceError
        if the file does not hold whole records."""
        size = os.path.getsize(path)
        if size % self.dtype.itemsize:
            raise CorruptTraceError(f"{path}: size {size} is not a multiple of {self.dtype.itemsize}")
        with open(path, "rb") as f:
            while True:
                chunk = np.fromfile(f, dtype=self.dtype, count=chunk_rows)
                if not len(chunk):
                    return
                yield chunk

    def read(self, path: str, start: int = 0, count: int = -1) -> np.ndarray:
        """Records ``start`` .. ``start + count`` (all of them from ``start``: -1)."""
        return np.fromfile(path, dtype=self.dtype, count=count, offset=start * self.dtype.itemsize)

    def map(self, path: str, rows: int | None = None) -> np.ndarray:
        """The file's first ``rows`` records mapped read-only; all of them
        (None), then CorruptTraceError if the file does not hold whole records."""
        if rows is None:
            size = os.path.getsize(path)
            if size % self.dtype.itemsize:
                raise CorruptTraceError(f"{path}: size {size} is not a multiple of {self.dtype.itemsize}")
            rows = size // self.dtype.itemsize
        if not rows:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(path, dtype=self.dtype, mode="r", shape=(rows,))


class AccessRecordFile(RecordFile):
    """The access files: data/<tid>.acc (ACCESS_DTYPE rows, the fault engine's)
    and data/<tid>.dat (compact records, the hybrid engine's), read alike: a
    compact file's rows are decoded to ACCESS_DTYPE on the fly (trace/compact.py),
    so ``rows``, ``read`` and ``map`` decode it whole (``chunks`` in bounded memory)."""

    def files(self, directory: str) -> list[tuple[int, str]]:
        compact = RecordFile(self.folder, COMPACT_EXTENSION, COMPACT_DTYPE)
        return sorted(super().files(directory) + compact.files(directory))

    @staticmethod
    def is_compact(path: str) -> bool:
        return path.endswith(COMPACT_EXTENSION)

    def compact_path(self, directory: str, tid: int) -> str:
        return os.path.join(directory, self.folder, f"{tid}{COMPACT_EXTENSION}")

    def thread_rows(self, directory: str, tid: int) -> int:
        """The access rows of one thread, whichever engine wrote them."""
        return sum(self.rows(path) for t, path in self.files(directory) if t == tid)

    def rows(self, path: str) -> int:
        if not self.is_compact(path):
            return super().rows(path)
        if not os.path.exists(path):
            return 0
        return sum(len(chunk) for chunk in self.chunks(path, 1 << 20))

    def chunks(self, path: str, chunk_rows: int) -> Iterator[np.ndarray]:
        if not self.is_compact(path):
            yield from super().chunks(path, chunk_rows)
            return
        from .compact import compact_chunks  # decoding (pyarrow's zstd) lives there

        yield from compact_chunks(path, chunk_rows)

    def read(self, path: str, start: int = 0, count: int = -1) -> np.ndarray:
        if not self.is_compact(path):
            return super().read(path, start, count)
        rows = self.map(path)
        return rows[start:] if count < 0 else rows[start : start + count]

    def map(self, path: str, rows: int | None = None) -> np.ndarray:
        if not self.is_compact(path):
            return super().map(path, rows)
        parts = list(self.chunks(path, 1 << 20))
        whole = np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)
        return whole if rows is None else whole[:rows]


CALL_RECORDS = RecordFile(CALLS_DIR, ".rec", RECORD_DTYPE)
ACCESS_RECORDS = AccessRecordFile(DATA_DIR, ".acc", ACCESS_DTYPE)
RECORD_FILES = (CALL_RECORDS, ACCESS_RECORDS)


# ------------------------------------------------------------------ meta.json
def write_meta(directory: str, meta: dict) -> None:
    meta = dict(meta, format_version=FORMAT_VERSION)
    path = os.path.join(directory, META_FILE)
    with writing(path + ".tmp"):  # OutputError (exit 23), one line
        _write_json_atomically(path, meta)


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
        raise CorruptTraceError(f"{directory}: not a madtrace trace directory (no {META_FILE})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptTraceError(f"{meta_path}: corrupt ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        raise CorruptTraceError(
            f"{meta_path}: unsupported or missing format_version (expected {FORMAT_VERSION})"
        )
    from .partial import settle  # a recording whose tracer died: what reached the disk

    return settle(meta, directory)


def _write_json_atomically(path: str, value: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- memory maps
def last_maps_text(directory: str) -> str | None:
    """The last memory map the trace holds (maps.end.txt, else
    maps.start.txt), None when it has neither."""
    for name in (MAPS_END_FILE, MAPS_START_FILE):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                return f.read()
    return None


# ------------------------------------------------------------ functions.json
def load_functions(directory: str):
    """functions.json (sites, functions, timestamps, tsc_hz...), as parsed
    (segmentation.load_tables checks its contents); None when the trace was
    recorded without function tracing."""
    path = os.path.join(directory, FUNCTIONS_FILE)
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CorruptTraceError(f"{path}: unreadable ({exc})".replace("\n", " ")) from None
    return doc


# --------------------------------------------------------- the lists of data/
def _load_list(directory: str, name: str, keys: tuple[str, ...]) -> list[dict]:
    """The JSON list ``name`` (empty if the file is missing), each item
    checked for ``keys`` (CorruptTraceError otherwise)."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            text = f.read()
        try:
            items = json.loads(text)
        except ValueError:
            from .partial import list_prefix, unfinished

            if not unfinished(directory):
                raise
            items = list_prefix(text)  # a killed recording: what reached the disk
        for item in items:
            for key in keys:
                item[key]  # noqa: B018 - presence check
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptTraceError(f"{path}: corrupt ({exc})") from None
    return items


def load_allocations_json(directory: str) -> list[dict] | None:
    """data/allocations.json of a trace older than data/blocks.bin (id, kind,
    name, address, size, site, tid, seq, order, freed_seq, freed_tid,
    freed_order, part_of); None when there is none.  Everyone else reads
    blocks with trace/blocks.py load_allocations (either file)."""
    if not os.path.exists(os.path.join(directory, ALLOCATIONS_FILE)):
        return None
    return _load_list(directory, ALLOCATIONS_FILE, ("id", "address", "size", "kind", "site"))


def load_block_events(directory: str) -> list[dict]:
    """Every block event (kind Y copy, W block store, G block fetch; address,
    source, size, tid, seq, order, site); empty without --data."""
    return _load_list(directory, BLOCK_EVENTS_FILE, ("kind", "address", "size", "order"))


def load_numa(directory: str) -> dict | None:
    """data/numa.json (nodes, threads, pages); None when the trace has none."""
    path = os.path.join(directory, NUMA_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            doc = json.load(f)
        doc["nodes"], doc["threads"], doc["pages"]  # noqa: B018 - presence check
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptTraceError(f"{path}: corrupt ({exc})") from None
    return doc


# ---------------------------------------------------------- store/meta.json
def store_path(directory: str, *parts: str) -> str:
    return os.path.join(directory, STORE_DIR, *parts)


def read_store_meta(directory: str) -> dict | None:
    """store/meta.json, None when it is missing or unreadable (the store is
    then rebuilt from the record files)."""
    try:
        with open(os.path.join(directory, STORE_META_FILE)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def write_store_meta(directory: str, meta: dict) -> None:
    meta = dict(meta, format_version=STORE_FORMAT_VERSION)
    os.makedirs(store_path(directory), exist_ok=True)
    _write_json_atomically(os.path.join(directory, STORE_META_FILE), meta)


def store_is_complete(directory: str) -> bool:
    meta = read_store_meta(directory)
    return bool(meta and meta.get("format_version") == STORE_FORMAT_VERSION and meta.get("complete"))
