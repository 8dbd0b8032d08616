# SPDX-License-Identifier: GPL-2.0-or-later
"""The heap block table of a trace directory: one fixed-size row per block
the allocation tracker saw, in block id order (id N is row N-1).

Files (in ``data/``; their layouts and names: ``format``):
* ``blocks.bin``: ``BLOCK_DTYPE`` rows.  The tracker appends a row when the
  block is allocated and writes its release fields in place when it is
  freed: the file is complete whenever the tracker has flushed it; at the
  end (meta.write_meta of the final meta.json, a snapshot's copy) it is
  sealed into the capture container (``seal_block_table``);
* ``blocks.sites``: the call sites the rows' ``site`` column indexes, one
  JSON string a line, appended (and written through) when a site first
  comes, before any row that uses it: a recording whose tracer was killed
  still has the sites of every row that reached the file.  ``kind`` indexes
  ``KINDS``.
Traces written before this table have ``data/allocations.json`` (a JSON list
of block dicts) instead; ``load_allocations`` reads either.

A block's name is MadT's forged name: ``<malloc0014@build_list+39>``, and
once freed ``<freed:0014@build_list+39>`` (``<unmap:...>`` for a mapping).
"""

from __future__ import annotations

import bisect
import json
import os
import struct

import numpy as np

from ..errors import CorruptTraceError, writing
from .format import (BLOCK_DTYPE, BLOCK_KINDS as KINDS, BLOCK_PART_OF_OFFSET as PART_OF_OFFSET,
                     BLOCK_RELEASE_OFFSET as RELEASE_OFFSET, BLOCK_SITES_FILE, BLOCKS_FILE,
                     CAPTURE_MAGIC, DATA_DIR, load_allocations_json)
from .record_files import BLOCK_RECORDS
from .format import unfinished

MAPPING_KINDS = ("memmap", "mremap")  # blocks the program mapped itself (mmap, mremap)
NO_PART = 0                            # part_of of a block no operator new wrapped


_RELEASE = struct.Struct("<B2xIQQ")       # format.BLOCK_RELEASE_DTYPE, packed
_PART_OF = struct.Struct("<I")


class BlockTableWriter:
    """Writes the block table while the target runs: rows are buffered and
    appended; a release (or an operator new wrapping a malloc block) is
    written into its row, in the buffer or in place in the file.  Memory:
    the buffer and the site strings, whatever the number of blocks."""

    BUFFER_ROWS = 4096

    def __init__(self, directory: str):
        os.makedirs(os.path.join(directory, DATA_DIR), exist_ok=True)
        self.path = os.path.join(directory, BLOCKS_FILE)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.sites_path = os.path.join(directory, BLOCK_SITES_FILE)
        self.sites_fd = os.open(self.sites_path,
                                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC,
                                0o644)
        self.buffer = np.zeros(self.BUFFER_ROWS, dtype=BLOCK_DTYPE)
        self.buffered = 0
        self.written = 0          # rows in the file
        self.sites: list[str] = []
        self._site_codes: dict[str, int] = {}

    def site_code(self, site: str) -> int:
        code = self._site_codes.get(site)
        if code is None:
            code = self._site_codes[site] = len(self.sites)
            self.sites.append(site)
            with writing(self.sites_path):
                os.write(self.sites_fd, (json.dumps(site) + "\n").encode())
        return code

    def add(self, block_id: int, kind: str, address: int, size: int, site: int, tid: int,
            seq: int, order: int) -> None:
        if block_id != self.written + self.buffered + 1:
            raise ValueError(f"block {block_id} out of order")
        self.buffer[self.buffered] = (block_id, tid, site, 0, address, size, seq, order,
                                      KINDS.index(kind), 0, 0, 0, 0)
        self.buffered += 1
        if self.buffered == self.BUFFER_ROWS:
            self._write_rows()

    def release(self, block_id: int, tid: int, seq: int, order: int) -> None:
        row = block_id - 1 - self.written
        if row >= 0:
            buffer = self.buffer
            buffer["freed"][row], buffer["freed_tid"][row] = 1, tid
            buffer["freed_seq"][row], buffer["freed_order"][row] = seq, order
        else:
            os.pwrite(self.fd, _RELEASE.pack(1, tid, seq, order),
                      (block_id - 1) * BLOCK_DTYPE.itemsize + RELEASE_OFFSET)

    def set_part_of(self, block_id: int, outer: int) -> None:
        row = block_id - 1 - self.written
        if row >= 0:
            self.buffer["part_of"][row] = outer
        else:
            os.pwrite(self.fd, _PART_OF.pack(outer),
                      (block_id - 1) * BLOCK_DTYPE.itemsize + PART_OF_OFFSET)

    def _write_rows(self) -> None:
        if self.buffered:
            with writing(self.path):
                os.pwrite(self.fd, self.buffer[:self.buffered].tobytes(),
                          self.written * BLOCK_DTYPE.itemsize)
            self.written += self.buffered
            self.buffered = 0

    def flush(self) -> None:
        """The file complete as of now."""
        self._write_rows()

    def close(self) -> None:
        if self.fd >= 0:
            self.flush()
            os.close(self.fd)
            os.close(self.sites_fd)
            self.fd = -1


SEAL_ROWS = 1 << 14     # rows a chunk of a sealed blocks.bin


def is_sealed(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(len(CAPTURE_MAGIC)) == CAPTURE_MAGIC


def seal_block_table(path: str) -> None:
    """blocks.bin as the recording left it (flat rows, updated in place) into
    the capture container (chunks of checked rows), in bounded memory."""
    if not os.path.exists(path) or is_sealed(path):
        return
    rows = os.path.getsize(path) // BLOCK_DTYPE.itemsize
    fd = BLOCK_RECORDS.create(path + ".tmp", truncate=True)
    try:
        for start in range(0, rows, SEAL_ROWS):
            count = min(SEAL_ROWS, rows - start)
            BLOCK_RECORDS.append(fd, np.fromfile(path, dtype=BLOCK_DTYPE, count=count,
                                                 offset=start * BLOCK_DTYPE.itemsize))
    finally:
        os.close(fd)
    os.replace(path + ".tmp", path)


def block_name(kind: str, block_id: int, site: str, freed: bool) -> str:
    if not freed:
        prefix = f"<{kind}"
    else:
        prefix = "<unmap:" if kind in MAPPING_KINDS else "<freed:"
    return f"{prefix}{block_id:04d}@{site}>"


class BlockTable:
    """The rows (``BLOCK_DTYPE``, memory-mapped when read from a file) with
    their ``kinds`` and ``sites`` strings."""

    def __init__(self, rows: np.ndarray, kinds: list[str], sites: list[str]):
        self.rows, self.kinds, self.sites = rows, kinds, sites

    def __len__(self) -> int:
        return len(self.rows)

    def names(self, freed: bool) -> list[str]:
        """Every block's name (``freed``: as a released block), by row."""
        return [block_name(self.kinds[k], i, self.sites[s], freed) for i, k, s in
                zip(self.rows["id"].tolist(), self.rows["kind"].tolist(),
                    self.rows["site"].tolist())]

    def dicts(self) -> list[dict]:
        """The rows as the dicts of ``allocations.json`` (small traces, exports)."""
        out = []
        for row in self.rows.tolist():
            (block_id, tid, site, part_of, address, size, seq, order, kind, freed,
             freed_tid, freed_seq, freed_order) = row
            kind_name, site_name = self.kinds[kind], self.sites[site]
            out.append({"id": block_id, "kind": kind_name, "address": address, "size": size,
                        "site": site_name, "tid": tid, "seq": seq, "order": order,
                        "freed_seq": freed_seq if freed else None,
                        "freed_tid": freed_tid if freed else None,
                        "freed_order": freed_order if freed else None,
                        "part_of": part_of or None,
                        "name": block_name(kind_name, block_id, site_name, bool(freed))})
        return out

    @classmethod
    def from_dicts(cls, blocks: list[dict]) -> "BlockTable":
        kinds, sites = list(KINDS), []  # type: list[str], list[str]
        site_index: dict[str, int] = {}
        rows = np.zeros(len(blocks), dtype=BLOCK_DTYPE)
        for i, b in enumerate(blocks):
            if b["kind"] not in kinds:
                kinds.append(b["kind"])
            if b["site"] not in site_index:
                site_index[b["site"]] = len(sites)
                sites.append(b["site"])
            freed = b.get("freed_order") is not None
            rows[i] = (b["id"], b.get("tid", 0), site_index[b["site"]], b.get("part_of") or 0,
                       b["address"], b["size"], b.get("seq", 0), b.get("order", 0),
                       kinds.index(b["kind"]), freed, b.get("freed_tid") or 0,
                       b.get("freed_seq") or 0, b.get("freed_order") or 0)
        return cls(rows, kinds, sites)


def load_block_table(directory: str) -> BlockTable:
    """The block table of a trace directory (empty when it has none)."""
    path = os.path.join(directory, BLOCKS_FILE)
    if not os.path.exists(path):
        legacy = load_allocations_json(directory)
        if legacy is None:
            return BlockTable(np.zeros(0, dtype=BLOCK_DTYPE), list(KINDS), [])
        return BlockTable.from_dicts(legacy)
    sites_path = os.path.join(directory, BLOCK_SITES_FILE)
    try:
        with open(sites_path, encoding="utf-8") as f:
            sites = [json.loads(line) for line in f if line.strip()]
        if not all(isinstance(x, str) for x in sites):
            raise ValueError("a site is not a string")
    except (OSError, ValueError) as exc:
        raise CorruptTraceError(f"{sites_path}: missing or corrupt ({exc})") from None
    kinds = list(KINDS)
    size = os.path.getsize(path)
    if size and is_sealed(path):
        rows = BLOCK_RECORDS.read(path)         # the container, every chunk checked
    elif not unfinished(directory):
        raise CorruptTraceError(f"{path}: no capture header at offset 0 (a trace made by an "
                                f"older madtrace, or not a capture file)")
    else:   # the recording runs, or its tracer was killed: the rows as they are
        whole = size // BLOCK_DTYPE.itemsize
        rows = np.memmap(path, dtype=BLOCK_DTYPE, mode="r", shape=(whole,)) if whole else \
            np.zeros(0, BLOCK_DTYPE)
    if len(rows):
        last = rows[-1]
        if int(last["id"]) != len(rows) or int(last["kind"]) >= len(kinds) or \
                int(rows["site"].max()) >= len(sites):
            raise CorruptTraceError(f"{path}: rows and {os.path.basename(BLOCK_SITES_FILE)} "
                                    "disagree")
    return BlockTable(rows, kinds, sites)


def load_allocations(directory: str) -> list[dict]:
    """Every block as a dict (id, kind, address, size, site, tid, seq, order,
    freed_seq/freed_tid/freed_order or None, part_of or None, name)."""
    return load_block_table(directory).dicts()


class BlockIndex:
    """Which heap block held an address when event ``order`` happened: the block
    alive then, else the last one freed before it (a use after free)."""

    def __init__(self, blocks: list[dict]):
        self.blocks = sorted(blocks, key=lambda b: (b["address"], b["order"]))
        self.starts = [b["address"] for b in self.blocks]
        self.max_size = max((b["size"] for b in self.blocks), default=0)

    def find(self, address: int, order: int) -> tuple[dict | None, bool]:
        i = bisect.bisect_right(self.starts, address) - 1
        freed_best = None
        while i >= 0 and self.starts[i] + self.max_size > address:
            b = self.blocks[i]
            i -= 1
            if not b["address"] <= address < b["address"] + max(b["size"], 1) or b["order"] > order:
                continue
            freed_at = b.get("freed_order")
            if freed_at is None or order < freed_at:
                return b, False
            if freed_best is None or freed_at > freed_best["freed_order"]:
                freed_best = b
        return freed_best, freed_best is not None
