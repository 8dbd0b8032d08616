"""Reading a trace directory back, in bounded memory: the one API that the
analyses, exports and reports use, whatever the on-disk format.

* ``iter_call_chunks(directory)``: (tid, chunk) per thread, in record order;
  each chunk is a numpy array of ``RECORD_DTYPE`` (calls/<tid>.rec).
* ``iter_access_chunks(directory)``: (tid, chunk) per thread, in access
  order; each chunk is a numpy array of ``ACCESS_DTYPE`` (data/<tid>.acc, or the
  compact data/<tid>.dat decoded: trace/compact.py).
* ``entry_counts(directory, sites)``: entry records per call site id.

Chunks hold at most ``chunk_rows`` rows, so a trace of any size is read with
memory bounded by the chunk size.  The files and their layouts: ``format``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..errors import CorruptTraceError
from .read_ahead import read_ahead
from .record_files import ACCESS_RECORDS, CALL_RECORDS

DEFAULT_CHUNK_ROWS = 1 << 20


def iter_call_chunks(directory: str, tid: int | None = None,
                     chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
    for t, path in CALL_RECORDS.files(directory):
        if tid is None or t == tid:
            for chunk in CALL_RECORDS.chunks(path, chunk_rows):
                yield t, chunk


def iter_access_chunks(directory: str, tid: int | None = None,
                       chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
    """(tid, ACCESS_DTYPE rows) of each thread's accesses in order, decoded ahead
    of the reader (read_ahead.py)."""
    for t, path in ACCESS_RECORDS.files(directory):
        if tid is None or t == tid:
            yield from ((t, chunk) for chunk in read_ahead(ACCESS_RECORDS.chunks(path,
                                                                                  chunk_rows)))


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
