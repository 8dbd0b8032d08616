"""Reading a trace directory back, in bounded memory: the one API that the
analyses, exports and reports use, whatever the on-disk format.

* ``iter_call_chunks(directory)``: (tid, chunk) per thread, in record order;
  each chunk is a numpy array of ``RECORD_DTYPE`` (calls/<tid>.rec).
* ``iter_access_chunks(directory)``: (tid, chunk) per thread, in access
  order; each chunk is a numpy array of ``ACCESS_DTYPE`` (data/<tid>.acc, or the
  compact data/<tid>.dat decoded: trace/compact.py).
* ``thread_ids(directory)``: every thread with call records or accesses.
* ``entry_counts(directory, sites)``: entry records per call site id.

Chunks hold at most ``chunk_rows`` rows, so a trace of any size is read with
memory bounded by the chunk size.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from ..capture.rings import RECORD_DTYPE
from .compact import access_chunks, access_files
from ..errors import CorruptTraceError
from .store import per_thread_files

DEFAULT_CHUNK_ROWS = 1 << 20


def file_chunks(path: str, dtype: np.dtype, chunk_rows: int) -> Iterator[np.ndarray]:
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        raise CorruptTraceError(f"{path}: size {size} is not a multiple of {dtype.itemsize}")
    with open(path, "rb") as f:
        while True:
            chunk = np.fromfile(f, dtype=dtype, count=chunk_rows)
            if not len(chunk):
                return
            yield chunk


def mapped_rows(path: str, dtype: np.dtype) -> np.ndarray:
    """The whole file as a read-only array of ``dtype`` rows (an empty file: no
    rows; a size that is not a whole number of rows: CorruptTraceError)."""
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        raise CorruptTraceError(f"{path}: size {size} is not a multiple of {dtype.itemsize}")
    if not size:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(size // dtype.itemsize,))


def iter_call_chunks(directory: str, tid: int | None = None,
                     chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
    for t, path in per_thread_files(directory, "calls", ".rec"):
        if tid is None or t == tid:
            for chunk in file_chunks(path, RECORD_DTYPE, chunk_rows):
                yield t, chunk


def iter_access_chunks(directory: str, tid: int | None = None,
                       chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
    for t, path in access_files(directory):
        if tid is None or t == tid:
            for chunk in access_chunks(directory, path, chunk_rows):
                yield t, chunk


def entry_counts(directory: str, sites: int, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> np.ndarray:
    """Entry records per call site id (0..sites-1) in the call record files."""
    counts = np.zeros(sites, dtype=np.uint64)
    for _, chunk in iter_call_chunks(directory, chunk_rows=chunk_rows):
        codes = chunk["code"]
        entries = codes[(codes & 1) == 0] >> 1
        if len(entries) and int(entries.max()) >= sites:
            raise CorruptTraceError(f"{directory}: a call record of site {int(entries.max())}, "
                                    f"of {sites} sites")
        counts += np.bincount(entries, minlength=sites).astype(np.uint64)
    return counts


def thread_ids(directory: str) -> list[int]:
    tids = {t for t, _ in per_thread_files(directory, "calls", ".rec")}
    tids |= {t for t, _ in access_files(directory)}
    return sorted(tids)
