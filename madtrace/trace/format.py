# SPDX-License-Identifier: GPL-2.0-or-later
"""The trace format: what a recording leaves on disk, defined once.

The contract between the two sides of madtrace: the tracer (target/,
rings/, calls/, data/, recording/) writes a trace directory with these names and layouts,
the offline side (trace/, analysis/, report/, export/, query) reads it back
through them.  Nothing else defines a record layout, a file name of a trace
directory or the page size; this module imports nothing but numpy and
madtrace.errors, so that both sides can stand on it.

A trace directory (``FORMAT_VERSION`` 2, in meta.json)::

  meta.json               META_FILE         read_meta / write_meta
  maps.start.txt          MAPS_START_FILE   /proc/PID/maps when tracing began
  maps.end.txt            MAPS_END_FILE     ... when it ended (or at a snapshot);
                                            saved_maps.last_maps_text() reads the later one
  functions.json          FUNCTIONS_FILE    load_functions: sites, functions, clock
  calls/<tid>.rec         CALL_RECORDS      RECORD_DTYPE, 16 bytes a record (in the
                                            capture container, as every raw file)
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
  data/block_events.bin   BLOCK_EVENTS_FILE BLOCK_EVENT_DTYPE, 64 bytes an event: memcpy/
                                            memset/syscalls (trace/block_event_records.py;
                                            data/block_events.json in older traces)
  data/numa.json          NUMA_FILE         load_numa: nodes, thread masks, page nodes
  data/allocator_calls.bin ALLOCATOR_CALLS_FILE  ALLOCATOR_CALL_DTYPE, 24 bytes a call
                                            of the allocator (trace/allocator_calls.py)
  store/                  STORE_DIR         the columnar store (Parquet tables:
                                            trace/columnar.py has their schemas)
  store/meta.json         STORE_META_FILE   read_store_meta / write_store_meta

docs/trace-format.md describes every field.

Record files
------------
Each per-thread binary file is described by one :class:`RecordFile` (its
folder, extension, dtype and capture kind), and every reader and writer goes
through it: ``files(directory)`` lists (tid, path), ``path(directory, tid)``
names one, ``rows(path)``, ``chunks(path, n)``, ``read(path, start, count)``
and ``map(path)`` read it, ``create(path)`` opens it for appending (header
written) and ``append(fd, rows)`` frames rows into chunks.  Nobody else
computes a record's offset or a file's row count.

The capture container
---------------------
Every raw capture file (calls/<tid>.rec, data/<tid>.acc, data/<tid>.dat,
data/allocator_calls.bin, data/blocks.bin) is one container, defined here once
(``CAPTURE_HEADER``, ``CHUNK_HEADER``) and read and written by
trace/capture_file.py (the C drain gets the constants from
capture_file's ``c_header()``, generated into build/native/capture_format.h):

* a file header of 32 bytes: ``CAPTURE_MAGIC`` "MADTRACE", the container's
  version ``CAPTURE_FORMAT_VERSION``, the kind (``CAPTURE_KINDS``), the
  record size, the largest chunk payload, and an XXH3-64 of those 24 bytes;
* then chunks, each a ``CHUNK_HEADER`` of 16 bytes (``CHUNK_MAGIC`` "MTCK",
  the payload's bytes, XXH3-64 of the payload seeded with its length) and
  the payload: whole records (.rec, .acc, allocator_calls.bin), or one
  compact block (.dat).  data/blocks.bin, whose rows the tracker updates in
  place while it records (a block's release), is a flat file of rows until
  the recording ends and then sealed into chunks (trace/blocks.py); a flat
  one is read only from an unfinished recording.  One chunk is one write of the writer (the ring
  drain: up to 1 MiB a drain; the access spool: up to ``CHUNK_MAX_BYTES``).

A reader checks every chunk it returns.  A bad file header or a complete
chunk whose magic, length or checksum is wrong is corruption
(CorruptTraceError, exit 18, naming the file and the byte offset).  A last
chunk cut short is the tail of a recording whose tracer was killed (or that
is still being written): its complete chunks are read, the rest is left
out; in a trace whose meta.json says the recording ended, it is corruption.
A file without the header was made by an older madtrace (exit 18).

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

import numpy as np

from ..errors import CorruptTraceError

FORMAT_VERSION = 2  # of the trace directory (meta.json format_version); 2: the capture container
STORE_FORMAT_VERSION = 4  # of the store (store/meta.json format_version); 2: accesses.allocator,
# block_events; 3: sources (the capture files it was built from, capture_sources); 4: the
# access rows as ids (access_rows, access_instructions, access_data, functions)

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
BLOCK_EVENTS_FILE = f"{DATA_DIR}/block_events.bin"
BLOCK_EVENTS_FILE_V1 = f"{DATA_DIR}/block_events.json"  # ... as older traces wrote them
NUMA_FILE = f"{DATA_DIR}/numa.json"
ALLOCATOR_CALLS_FILE = f"{DATA_DIR}/allocator_calls.bin"
INSTRUCTIONS_FILE = f"{DATA_DIR}/instructions.jsonl"  # of the compact access records
INSTRUCTIONS_FILE_V1 = f"{DATA_DIR}/instructions.json"  # ... as traces of format 1 wrote it
STORE_META_FILE = f"{STORE_DIR}/meta.json"
EXEC_DIR_PREFIX = "exec."  # exec.<n>: the trace of the n-th image the process exec'd
FORK_DIR_PREFIX = "fork."  # fork.<pid>: the trace of a fork child followed
# a flight recorder's folder (--flight): snapshot.<n>, each a trace directory, and
# flight.json listing them
FLIGHT_INDEX_FILE = "flight.json"
SNAPSHOT_DIR_PREFIX = "snapshot."


def exec_dir(directory: str, number: int) -> str:
    return os.path.join(directory, f"{EXEC_DIR_PREFIX}{number}")


def fork_dir(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{FORK_DIR_PREFIX}{pid}")


# ------------------------------------------------------------------- records
# A call record (calls/<tid>.rec), as the trampolines write it into the ring (layout.h)
# and the drain copies it out: the TSC (0 with --no-time); code = site id << 1 | 1 for
# exits; the callee's rsp at entry, low 32 bits (closes frames left by longjmp, tail calls).
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


# A block event (data/block_events.bin, trace/block_event_records.py): MadT's Y
# (memcpy/memmove), W (memset, a system call writing traced memory) and G (a
# system call reading it), one record each, in the order the tracer met them:
# its order (shared with accesses and allocations), seq (the thread's call records
# before it), the call site or system call (rip), the range (address, size) and,
# for Y, where the bytes came from (source); block / source_block: the heap block
# that held the address then (0: none; the tracer's block index, as an access's),
# freed when BLOCK_EVENT_FREED / BLOCK_EVENT_SOURCE_FREED is set in flags; what:
# an index into BLOCK_EVENT_WHATS; kind: an index into BLOCK_EVENT_KINDS.
BLOCK_EVENT_DTYPE = np.dtype(
    [
        ("order", "<u8"),
        ("seq", "<u8"),
        ("rip", "<u8"),
        ("address", "<u8"),
        ("size", "<u8"),
        ("source", "<u8"),
        ("tid", "<u4"),
        ("block", "<u4"),
        ("source_block", "<u4"),
        ("kind", "u1"),
        ("what", "u1"),
        ("flags", "u1"),
        ("pad", "u1"),
    ]
)
BLOCK_EVENT_KINDS = ("Y", "W", "G")
BLOCK_EVENT_WHATS = (
    "memcpy",
    "memmove",
    "memset",
    "read",
    "write",
    "pread64",
    "pwrite64",
    "sendto",
    "recvfrom",
    "getrandom",
    "getdents64",
    "readv",
    "writev",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "sendmsg",
    "recvmsg",
)
BLOCK_EVENT_HAS_SOURCE, BLOCK_EVENT_FREED, BLOCK_EVENT_SOURCE_FREED = 1, 2, 4


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
# A block with magic COMPACT_MAGIC_PLANES "MTZ2" holds the same records as byte
# planes before compression (byte k of every record, then byte k + 1...: what
# the tracer writes; zstd is 3-10x faster on
# addresses that step by a few bytes, and the blocks 2-90x smaller); "MTZ1"
# blocks hold the records as they are.
COMPACT_DTYPE = np.dtype([("a", "<u8"), ("id", "<u4"), ("b", "<u4")])
COMPACT_BLOCK_HEADER = np.dtype([("magic", "<u4"), ("raw", "<u4"), ("packed", "<u4"), ("records", "<u4")])
COMPACT_MAGIC = 0x315A544D  # "MTZ1"
COMPACT_MAGIC_PLANES = 0x325A544D  # "MTZ2"
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


# The capture container (module docstring; trace/capture_file.py reads and writes it).
CAPTURE_MAGIC = b"MADTRACE"
CAPTURE_FORMAT_VERSION = 1
CAPTURE_HEADER = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u2"),
        ("kind", "<u2"),
        ("record_size", "<u4"),
        ("max_chunk", "<u4"),
        ("reserved", "<u4"),
        ("check", "<u8"),  # XXH3-64 of the 24 bytes before it
    ]
)
CHUNK_HEADER = np.dtype([("magic", "<u4"), ("length", "<u4"), ("check", "<u8")])
CHUNK_MAGIC = 0x4B43544D  # "MTCK"
CHUNK_MAX_BYTES = 4 << 20  # the largest payload a writer frames (a reader refuses more)
CAPTURE_KINDS = {
    "calls": 1,
    "accesses": 2,
    "compact": 3,
    "allocator calls": 4,
    "blocks": 5,
    "block events": 6,
}


# ------------------------------------------------------------------ meta.json
# a container with more items than this is written on one line: json's indenting
# encoder is pure Python (~1 us an item), its one-line encoder is C (python3's
# meta.json: ~19 000 per-instruction counts written twice took 1.3 s of 11.6 s)
JSON_ONE_LINE_ITEMS = 64


def _json_text(value, level: int = 0) -> str:
    """JSON of ``value``: keys sorted, small dicts and lists indented one space a
    level (as ``json.dumps(indent=1)``), large ones on one line."""
    if isinstance(value, dict) and value and len(value) <= JSON_ONE_LINE_ITEMS:
        keys = {k if isinstance(k, str) else json.dumps(k): v for k, v in value.items()}
        pad = " " * (level + 1)
        items = [f"{pad}{json.dumps(k)}: {_json_text(keys[k], level + 1)}" for k in sorted(keys)]
        return "{\n" + ",\n".join(items) + "\n" + " " * level + "}"
    if isinstance(value, list) and value and len(value) <= JSON_ONE_LINE_ITEMS:
        pad = " " * (level + 1)
        items = [pad + _json_text(v, level + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * level + "]"
    return json.dumps(value, sort_keys=True)


def write_json_atomically(path: str, value: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(_json_text(value))
        f.write("\n")
    os.replace(tmp, path)


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
def load_json_list(directory: str, name: str, keys: tuple[str, ...]) -> list[dict]:
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
    return load_json_list(directory, ALLOCATIONS_FILE, ("id", "address", "size", "kind", "site"))


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
    write_json_atomically(os.path.join(directory, STORE_META_FILE), meta)


# ------------------------------------------------- a recording still running
def unfinished(directory: str) -> bool:
    """Whether the recording of ``directory`` never wrote its end (its tracer is
    still running or was killed): its lists may end mid-item."""
    try:
        with open(os.path.join(directory, META_FILE)) as f:
            return json.load(f).get("outcome") == "running"
    except (OSError, ValueError, AttributeError):
        return False


def list_prefix(text: str) -> list:
    """The complete items of a JSON list cut short (``[{...},{...},{..``)."""
    decoder = json.JSONDecoder()
    items: list = []
    at = text.find("[") + 1
    if at <= 0:
        return items
    while True:
        while at < len(text) and text[at] in " \n\r\t,":
            at += 1
        try:
            item, at = decoder.raw_decode(text, at)
        except ValueError:
            return items
        items.append(item)
