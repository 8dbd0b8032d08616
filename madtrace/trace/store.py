"""Creating trace directories and taking snapshots of them (the names and
layouts of what is in them: ``format``).

A directory is never overwritten unless ``force`` is given: only a trace
directory (one with a meta.json, or a recording killed before it wrote one:
a calls directory and nothing but what madtrace writes) or an empty one is
replaced.
"""

from __future__ import annotations

import os
import shutil

from ..errors import CorruptTraceError, OutputExistsError, writing
from .format import (BLOCKS_FILE, CALLS_DIR, DATA_DIR, EXEC_DIR_PREFIX, FORK_DIR_PREFIX,
                     FUNCTIONS_FILE, MAPS_END_FILE, MAPS_START_FILE, META_FILE, STORE_DIR)
from .record_files import CALL_RECORDS

# what a recording writes at the top of its directory
_RECORDING_ENTRIES = {META_FILE, CALLS_DIR, DATA_DIR, STORE_DIR, FUNCTIONS_FILE, MAPS_START_FILE,
                      MAPS_END_FILE}


def create_trace_dir(path: str, force: bool) -> str:
    with writing(path):
        return _create_trace_dir(path, force)


def _create_trace_dir(path: str, force: bool) -> str:
    if os.path.lexists(path):
        if not force:
            raise OutputExistsError(f"{path} already exists (use --force to overwrite it)")
        if os.path.isdir(path) and not os.path.islink(path):
            if not os.path.exists(os.path.join(path, META_FILE)) and os.listdir(path) \
                    and not _killed_recording(path):
                raise OutputExistsError(
                    f"{path} exists and is not a madtrace trace directory; not overwriting it")
            shutil.rmtree(path)
        elif os.path.islink(path):
            os.unlink(path)     # the link goes, not what it points to
        else:
            raise OutputExistsError(f"{path} exists and is a file, not a trace directory; "
                                    "not overwriting it")
    os.mkdir(path)      # its parent must exist (a mistyped path is an error, not a new tree)
    return path


def _killed_recording(path: str) -> bool:
    """A recording killed before it wrote meta.json: its calls directory, and
    only names a recording writes."""
    entries = os.listdir(path)
    return CALLS_DIR in entries and all(
        e in _RECORDING_ENTRIES or e.startswith((EXEC_DIR_PREFIX, FORK_DIR_PREFIX))
        for e in entries)


def default_trace_dir(base: str = "madtrace.data") -> str:
    """``madtrace.data``, or ``madtrace.data.N`` for the first N that is free."""
    if not os.path.lexists(base):
        return base
    n = 1
    while os.path.lexists(f"{base}.{n}"):
        n += 1
    return f"{base}.{n}"


def record_file_sizes(directory: str) -> dict[str, int]:
    """{name: bytes} of the call record files (calls/<tid>.rec) written so far."""
    return {os.path.basename(path): os.path.getsize(path)
            for _, path in CALL_RECORDS.files(directory)}


def _copy_prefix(source: str, destination: str, size: int) -> None:
    with open(source, "rb") as src, open(destination, "wb") as dst:
        while size > 0:
            chunk = src.read(min(size, 1 << 20))
            if not chunk:
                raise CorruptTraceError(f"{source}: shorter than the {size} bytes expected")
            dst.write(chunk)
            size -= len(chunk)


def copy_trace_files(source: str, destination: str, record_sizes: dict[str, int]) -> None:
    """Copy trace directory ``source`` into ``destination`` (which exists) for a
    snapshot: every file but meta.json (the snapshot writes its own) and the
    columnar store (written while the recording runs: the snapshot builds its
    own), the call record files only up to ``record_sizes`` (what the
    snapshot's counts cover, while the live files keep growing; files not in
    it are left out)."""
    def ignore(folder, names):
        if os.path.samefile(folder, source):
            return [n for n in names if n.startswith(META_FILE) or n in (CALLS_DIR, STORE_DIR)]
        return []
    shutil.copytree(source, destination, dirs_exist_ok=True, ignore=ignore)
    if record_sizes:
        os.makedirs(os.path.join(destination, CALLS_DIR), exist_ok=True)
    for name, size in record_sizes.items():
        _copy_prefix(os.path.join(source, CALLS_DIR, name),
                     os.path.join(destination, CALLS_DIR, name), size)
    from .blocks import seal_block_table      # the copy of a table still written in place
    seal_block_table(os.path.join(destination, BLOCKS_FILE))


def write_text(path: str, name: str, text: str) -> None:
    with writing(os.path.join(path, name)), open(os.path.join(path, name), "w") as f:
        f.write(text)
