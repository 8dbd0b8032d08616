# SPDX-License-Identifier: GPL-2.0-or-later
"""The flight recorder: a recording kept in bounded memory, written out on a
trigger.

The recording writes its trace directory as always, but into a scratch
directory in memory (``/dev/shm``: tmpfs, pages of RAM; ``$MADTRACE_FLIGHT_DIR``
chooses another place).  Every tick (the controller's bound timer, 50 ms) the
recorder indexes the chunks the writers completed in each growing file
(``StreamWindow``) and, while the files hold more than the bound (or chunks
older than ``keep`` seconds), forgets the oldest tick's chunks in every file
at once and gives their memory back: the files, all threads together, keep
the last SIZE (or the last SECONDS) of the recording, cut at one instant to
within a tick.  Nothing goes to disk until a snapshot: the window is then
written as an ordinary trace directory (``write_window``: the chunks kept,
their seqs moved back (rebase.py), the heap block table whole, so that a block
allocated before the window keeps its forged name), and the recording writes
its meta.json there (Recording.snapshot), marked with the window.

What stays whole: the heap block table (64 bytes a block), the instruction
table and the names; they grow with the program's allocations and code, not
with time, and count against the bound.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import OutputExistsError, UsageError, writing
from ..trace.blocks import is_sealed, seal_block_table
from ..trace.compact import InstructionColumns, iter_blocks
from ..trace.format import (
    ACCESS_DTYPE,
    ALLOCATOR_CALL_DTYPE,
    ALLOCATOR_CALLS_FILE,
    BLOCK_DTYPE,
    BLOCK_EVENT_DTYPE,
    BLOCK_EVENTS_FILE,
    BLOCKS_FILE,
    CALLS_DIR,
    EXEC_DIR_PREFIX,
    FLIGHT_INDEX_FILE,
    DATA_DIR,
    KIND_LOAD,
    KIND_STORE,
    META_FILE,
    RECORD_DTYPE,
    SNAPSHOT_DIR_PREFIX,
    STORE_DIR,
)
from ..trace.capture_file import write_all
from ..trace.record_files import ACCESS_RECORDS, BLOCK_RECORDS, COMPACT_RECORDS
from .rebase import Rebase, framed, rebase_blocks
from .window import PAGE, StreamWindow

SCRATCH_ENV = "MADTRACE_FLIGHT_DIR"
SCRATCH_PREFIX = "madtrace-flight."  # then madtrace's pid
OTHERS_EVERY = 20  # ticks between two sums of the files that stay whole


def _stream_kind(relative: str) -> tuple[str, int, int | None] | None:
    """(kind, record size, tid) of a file the writers append chunks to, or None."""
    folder, name = os.path.split(relative)
    stem, ext = os.path.splitext(name)
    if folder == CALLS_DIR and ext == ".rec" and stem.isdigit():
        return "calls", RECORD_DTYPE.itemsize, int(stem)
    if folder == DATA_DIR and ext == COMPACT_RECORDS.extension and stem.isdigit():
        return "compact", 0, int(stem)
    if folder == DATA_DIR and ext == ACCESS_RECORDS.extension and stem.isdigit():
        return "accesses", ACCESS_DTYPE.itemsize, int(stem)
    if relative == BLOCK_EVENTS_FILE:
        return "block events", BLOCK_EVENT_DTYPE.itemsize, None
    if relative == ALLOCATOR_CALLS_FILE:
        return "allocator calls", ALLOCATOR_CALL_DTYPE.itemsize, None
    return None


def scratch_directory(bound: int) -> str:
    """A new directory in memory with room for ``bound`` bytes."""
    parent = os.environ.get(SCRATCH_ENV) or (
        "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    )
    try:
        room = os.statvfs(parent)
    except OSError as exc:
        raise UsageError(f"the flight recorder's place {parent}: {exc.strerror}") from None
    _remove_dead_scratch(parent)
    free = room.f_bavail * room.f_frsize
    if free < bound * 1.1:
        raise UsageError(
            f"--flight {bound / 1048576:.0f} MiB does not fit in {parent} "
            f"({free / 1048576:.0f} MiB free): a smaller SIZE, or "
            f"${SCRATCH_ENV} naming a place with room"
        )
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}.", dir=parent)


def _remove_dead_scratch(parent: str) -> None:
    """The scratch directories of flight recorders whose madtrace was killed."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(SCRATCH_PREFIX):
            continue
        pid = name[len(SCRATCH_PREFIX) :].split(".")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


@dataclass
class Tick:
    number: int
    monotonic: float
    wall: float


@dataclass
class FlightRecorder:
    """See the module docstring.  ``folder``: where snapshots go (DIR/snapshot.N);
    ``bound``: bytes kept at most (None: ``keep`` alone bounds); ``keep``:
    seconds kept at most; ``snapshots``: the number of snapshots kept (None: all)."""

    folder: str
    bound: int | None
    keep: float | None = None
    snapshots: int | None = None
    scratch: str = ""
    root: str = ""  # the trace directory of the image traced now (scratch, or an exec's in it)
    streams: dict[str, StreamWindow] = field(default_factory=dict)
    ticks: collections.deque = field(default_factory=collections.deque)  # from the oldest kept
    others: int = 0  # bytes of the files that stay whole
    window_start: float = 0.0  # wall time the oldest chunk kept was first seen after
    taken: list[dict] = field(default_factory=list)  # the snapshots written, oldest first
    peak_bytes: int = 0
    pid: int = 0  # the target's: the files of its threads that ended go
    gone_dropped_bytes: int = 0  # dropped from the files removed since
    gone_dropped_records: int = 0
    gone_bases: dict[int, int] = field(default_factory=dict)  # of the threads whose files went
    on_call_chunks: Callable[[list], None] | None = None  # the triggers on calls

    def __post_init__(self) -> None:
        if self.bound is None and self.keep is None:
            raise UsageError("the flight recorder needs a bound: --flight SIZE or --keep SECONDS")
        self.scratch = scratch_directory(self.bound or 0)
        self.root = self.scratch
        self._ticks_taken = 0
        self.window_start = time.time()
        self._number = 0
        # a tick runs from the controller's timer, a signal handler of the tracer's main
        # thread: it must not change the window while a tick or a snapshot reads it
        self._busy = False

    # ------------------------------------------------------------- the folder
    def create_folder(self, force: bool) -> None:
        """DIR: the snapshots' folder (a former one replaced with ``force``)."""
        path = self.folder
        with writing(path):
            if os.path.lexists(path):
                if not force:
                    raise OutputExistsError(f"{path} already exists (use --force to overwrite it)")
                if not os.path.exists(os.path.join(path, FLIGHT_INDEX_FILE)):
                    raise OutputExistsError(
                        f"{path} exists and is not a flight recorder's folder; not overwriting it"
                    )
                shutil.rmtree(path)
            os.mkdir(path)
            self._write_index()

    def _write_index(self) -> None:
        index = {
            "flight": {
                "bound_bytes": self.bound,
                "keep_seconds": self.keep,
                "snapshots_kept": self.snapshots,
            },
            "snapshots": self.taken,
        }
        path = os.path.join(self.folder, FLIGHT_INDEX_FILE)
        with writing(path), open(path + ".tmp", "w") as f:
            json.dump(index, f, indent=1)
        os.replace(path + ".tmp", path)

    def next_snapshot(self) -> str:
        self._number += 1
        return os.path.join(self.folder, f"{SNAPSHOT_DIR_PREFIX}{self._number}")

    def taken_one(self, directory: str, reason: str, meta_flight: dict) -> None:
        """A snapshot was written to ``directory``: listed, the oldest beyond
        ``snapshots`` removed (those of the folder only)."""
        self.taken.append(
            {
                "directory": os.path.relpath(directory, self.folder)
                if directory.startswith(self.folder + os.sep)
                else directory,
                "trigger": reason,
                "window_start": meta_flight["window_start"],
                "window_end": meta_flight["window_end"],
            }
        )
        inside = [s for s in self.taken if not os.path.isabs(s["directory"])]
        while self.snapshots is not None and len(inside) > self.snapshots:
            oldest = inside.pop(0)
            shutil.rmtree(os.path.join(self.folder, oldest["directory"]), ignore_errors=True)
            self.taken.remove(oldest)
        self._write_index()

    # ------------------------------------------------------------- the window
    def tick(self) -> None:
        """Index what the writers completed, then trim to the bound.  The call
        record chunks new since the last tick go to ``on_call_chunks`` first, as
        (path, tid, offset, length).  Skipped inside another tick or a snapshot
        (the timer's signal handler interrupted it)."""
        if self._busy:
            return
        self._busy = True
        try:
            self._index_and_trim()
        finally:
            self._busy = False

    def _index_and_trim(self) -> None:
        self._ticks_taken += 1
        now = Tick(self._ticks_taken, time.monotonic(), time.time())
        self.ticks.append(now)
        self._discover()
        new_calls = []
        for path, window in self.streams.items():
            before = len(window.kept)
            if (
                window.scan(now.number)
                and window.record_size == RECORD_DTYPE.itemsize
                and path.startswith(os.path.join(self.root, CALLS_DIR) + os.sep)
            ):
                tid = int(os.path.splitext(os.path.basename(path))[0])
                new_calls += [(path, tid, offset, length) for offset, length, _ in list(window.kept)[before:]]
        if new_calls and self.on_call_chunks is not None:
            self.on_call_chunks(new_calls)
        if now.number % OTHERS_EVERY == 1:
            self.others = self._whole_files_bytes()
            self._forget_ended_threads()
        self._trim(now)
        self._forget_old_ticks()
        self.peak_bytes = max(self.peak_bytes, self.held_bytes())

    def held_bytes(self) -> int:
        """What the scratch directory holds: the chunks kept, a page a growing file
        (its header, never given back), the files that stay whole."""
        return self.others + sum(w.kept_bytes + PAGE for w in self.streams.values())

    def _discover(self) -> None:
        for folder in (CALLS_DIR, DATA_DIR):
            try:
                names = os.listdir(os.path.join(self.root, folder))
            except FileNotFoundError:
                continue
            for name in names:
                path = os.path.join(self.root, folder, name)
                if path in self.streams:
                    continue
                kind = _stream_kind(os.path.join(folder, name))
                if kind is not None:
                    self.streams[path] = StreamWindow(path, kind[1])

    def _forget_ended_threads(self) -> None:
        """The files of threads that ended, once the window holds nothing of them,
        are removed (a thread-per-request server makes a file per request)."""
        for path, window in list(self.streams.items()):
            kind = _stream_kind(os.path.relpath(path, self.root))
            tid = kind[2] if kind is not None else None
            if window.kept or tid is None or os.path.exists(f"/proc/{self.pid}/task/{tid}"):
                continue
            window.close()
            del self.streams[path]
            self.gone_dropped_bytes += window.dropped_bytes
            if kind is not None and kind[0] == "calls":
                self.gone_dropped_records += window.dropped_records
                self.gone_bases[tid] = window.dropped_records
            try:
                os.unlink(path)
            except OSError:
                pass

    def _whole_files_bytes(self) -> int:
        total = 0
        for folder, _dirs, names in os.walk(self.root):
            for name in names:
                path = os.path.join(folder, name)
                if path not in self.streams:
                    try:
                        total += os.stat(path).st_size
                    except OSError:
                        continue
        return total

    def _trim(self, now: Tick) -> None:
        """Drop the chunks older than ``keep`` (every file at once), then, while
        over the bound, the oldest chunk of all (the first seen; of two seen at
        the same tick, the one of the file that holds the most)."""
        while self.keep is not None:
            ticks = [t for t in (w.oldest_tick() for w in self.streams.values()) if t is not None]
            if not ticks or now.monotonic - self._tick(min(ticks)).monotonic <= self.keep:
                break
            for window in self.streams.values():
                window.drop_through(min(ticks))
            self.window_start = self._tick(min(ticks)).wall
        held = self.held_bytes()
        cut = 0
        while self.bound is not None and held > self.bound:
            candidates = [w for w in self.streams.values() if w.kept]
            if not candidates:
                break
            oldest = min(candidates, key=lambda w: (w.kept[0][2], -w.kept_bytes))
            cut = oldest.kept[0][2]
            held -= oldest.drop_through(cut, most=1)
            self.window_start = self._tick(cut).wall
        if cut > 1:
            # every file starts within the same tick: a file whose chunks are small
            # (compressed accesses) keeps no more of the past than the others
            for window in self.streams.values():
                window.drop_through(cut - 1)

    def _tick(self, number: int) -> Tick:
        return self.ticks[number - self.ticks[0].number]

    def _forget_old_ticks(self) -> None:
        """The ticks before the oldest chunk kept (memory flat over a long run)."""
        oldest = min((w.kept[0][2] for w in self.streams.values() if w.kept), default=self.ticks[-1].number)
        while len(self.ticks) > 1 and self.ticks[0].number < oldest:
            self.ticks.popleft()

    def dropped(self) -> dict[str, int]:
        return {
            "bytes": self.gone_dropped_bytes + sum(w.dropped_bytes for w in self.streams.values()),
            "call_records": self.gone_dropped_records
            + sum(
                w.dropped_records
                for w in self.streams.values()
                if os.path.basename(os.path.dirname(w.path)) == CALLS_DIR
            ),
        }

    def bases(self) -> dict[int, int]:
        """tid -> call records dropped before the window (what their seqs move back by)."""
        out = dict(self.gone_bases)
        for path, window in self.streams.items():
            kind = _stream_kind(os.path.relpath(path, self.root))
            if kind is not None and kind[0] == "calls" and kind[2] is not None and window.dropped_records:
                out[kind[2]] = window.dropped_records
        return out

    # ------------------------------------------------------------ a snapshot
    def write_window(self, directory: str, cut_tsc: int | None = None) -> dict:
        """The window, as of now, into ``directory`` (it exists): every file of
        the scratch directory but meta.json and a store, the growing ones from the
        window's first chunk, seqs moved back; ``cut_tsc``: the call records
        after this time stamp left out, and their threads' accesses after them
        (rebase.py).  Returns meta.json's ``flight``."""
        self.tick()  # up to what is complete now
        self._busy = True
        try:
            return self._write_window(directory, cut_tsc)
        finally:
            self._busy = False

    def _write_window(self, directory: str, cut_tsc: int | None) -> dict:
        rebase = Rebase(self.bases(), cut_tsc or None)
        copies, whole = [], []
        for folder, dirs, names in os.walk(self.root):
            dirs[:] = [d for d in dirs if not d.startswith(EXEC_DIR_PREFIX)]  # later images
            relative_folder = os.path.relpath(folder, self.root)
            if relative_folder == STORE_DIR or relative_folder.startswith(STORE_DIR + os.sep):
                continue
            os.makedirs(os.path.join(directory, relative_folder), exist_ok=True)
            for name in names:
                relative = os.path.normpath(os.path.join(relative_folder, name))
                if relative == META_FILE or name.endswith(".tmp"):
                    continue
                source, target = os.path.join(folder, name), os.path.join(directory, relative)
                window = self.streams.get(source)
                if window is not None:
                    kind = _stream_kind(relative)
                    copies.append((kind[0] != "calls" if kind else True, window, kind, target))
                else:
                    whole.append((relative, source, target))
        for _after_calls, window, kind, target in sorted(copies, key=lambda c: c[0]):
            self._copy_stream(window, kind, target, rebase)
        for relative, source, target in whole:
            if relative == BLOCKS_FILE:
                self._copy_blocks(source, target, rebase.bases)
            else:
                shutil.copyfile(source, target)
        end = time.time()
        dropped = self.dropped()
        return {
            "bound_bytes": self.bound,
            "keep_seconds": self.keep,
            "window_start": self.window_start,
            "window_end": end,
            "seconds": round(end - self.window_start, 3),
            "cut_at_trigger": bool(rebase.ended),
            "dropped_bytes": dropped["bytes"],
            "dropped_call_records": dropped["call_records"],
            "held_bytes": self.held_bytes(),
            "peak_bytes": self.peak_bytes,
            "call_records_dropped_per_thread": {str(t): n for t, n in rebase.bases.items()},
        }

    def _copy_stream(self, window: StreamWindow, kind: tuple | None, target: str, rebase: Rebase) -> None:
        chunks = window.chunks()
        if not chunks:
            return  # every chunk of this file is older than the window
        name, _size, tid = kind or ("", 0, None)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, [window.header()])
            for offset, length in chunks:
                payload = rebase.transform(name, window.payload(offset, length), tid)
                if payload is not None:
                    write_all(fd, framed(payload))
        finally:
            os.close(fd)

    @staticmethod
    def _copy_blocks(source: str, target: str, bases: dict[int, int]) -> None:
        # flat rows while the recording runs, sealed into chunks at its end
        rows = (
            BLOCK_RECORDS.map(source).copy() if is_sealed(source) else np.fromfile(source, dtype=BLOCK_DTYPE)
        )
        rebase_blocks(rows, bases)
        rows.tofile(target)
        seal_block_table(target)

    def follow(self, directory: str) -> None:
        """The process exec'd: the window is the new image's, traced in
        ``directory`` (inside the scratch); the old image's record files go (its
        meta.json stays: the images index reads it)."""
        for path, window in self.streams.items():
            window.close()
            try:
                os.unlink(path)
            except OSError:
                pass
        self.streams.clear()
        self.gone_bases.clear()
        self.root = directory
        self.window_start = time.time()

    def close(self) -> None:
        for window in self.streams.values():
            window.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def window_access_counts(directory: str, name_of) -> dict[str, dict[str, int]]:
    """meta.json's ``accesses`` of a window: {instruction name: {"L", "S"}},
    counted from its access files (``name_of(rip)``: the instruction's name)."""
    per_rip: dict[tuple[int, str], int] = {}
    compact = COMPACT_RECORDS.files(os.path.join(directory))
    if compact:
        table = InstructionColumns.load(directory)
        loads = np.zeros(len(table.rip), dtype=np.int64)
        stores = np.zeros(len(table.rip), dtype=np.int64)
        for _tid, path in compact:
            for _offset, records in iter_blocks(path):
                ids = records["id"][records["id"] != 0].astype(np.int64)
                counted = np.bincount(ids, minlength=len(table.rip))[: len(table.rip)]
                loads += np.where(table.kind & KIND_LOAD, counted, 0)
                stores += np.where(table.kind & KIND_STORE, counted, 0)
        for i in np.nonzero(loads | stores)[0].tolist():
            rip = int(table.rip[i])
            for kind, counts in (("L", loads), ("S", stores)):
                if counts[i]:
                    per_rip[(rip, kind)] = per_rip.get((rip, kind), 0) + int(counts[i])
    for _tid, path in ACCESS_RECORDS.files(directory):
        if path.endswith(COMPACT_RECORDS.extension):
            continue
        for rows in ACCESS_RECORDS.chunks(path, 1 << 20):
            for kind, code in (("L", KIND_LOAD), ("S", KIND_STORE)):
                rips, counts = np.unique(rows["rip"][rows["kind"] == code], return_counts=True)
                for rip, n in zip(rips.tolist(), counts.tolist()):
                    per_rip[(rip, kind)] = per_rip.get((rip, kind), 0) + n
    out: dict[str, dict[str, int]] = {}
    for (rip, kind), n in per_rip.items():
        entry = out.setdefault(name_of(rip), {"L": 0, "S": 0})
        entry[kind] += n
    return out
