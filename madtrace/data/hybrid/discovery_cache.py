# SPDX-License-Identifier: GPL-2.0-or-later
"""What the hybrid engine's runs learnt of a binary: the functions it relocated.

Each run discovers, one fault at a time, which functions of each binary touch
traced data, and relocates them (rewriting.py); the next run on the same
binaries does the same again.  This cache keeps, per binary, every function a
run relocated (its bounds and the instructions it was asked to probe beyond
the copier's own choice), so that the next run lays those copies out and
points their entries at them before the program runs (at a launched
program's or an exec'd image's entry point; for a library loaded later: when
its first fault makes it known; not at an attach, whose threads are anywhere):
a warm run faults only on what is new.  The copies themselves are made again (their bytes depend on where the
code area lands and on the run's instruction ids), from the analysis cache.

Per program: a library's list is that of the runs of one program (the
main executable: its key), so that what runs of other programs touched in the
C library is not laid out (kept per library alone, it grew with every program
traced, and every run laid it all out before its program started: after one
recording of ``date``, ``/bin/true`` made date's 116 copies instead of its own
12).  Without a main executable with a file, the binary's own list.

Where: beside the copier's caches, one file per binary and program,
``<key>.of-<program>.mtd`` (the keys: build-id and size, as theirs; the
program's hashed), in the cache's container: ``MTDISC01``, the JSON header
(the analyser's version: the copier's source and capstone's, as
entry_cache.py; the binary's path and build-id, the program's path), the
payload ``marshal`` of {function start: (end, (wanted instruction, ...))},
ELF-relative addresses.
A function is laid out again only when its bounds are still those the binary
gives (symbol or .eh_frame) and its bytes copy (a rebuilt binary has another
key: its old list is never read).  A damaged file is said in one line and
rebuilt; another analyser's is replaced quietly.

``DiscoveryCache.functions(module)``: the kept list; ``learnt(module, start,
end, wanted)``: a function this run relocated; ``save()`` writes each binary
whose list grew (at the end of data tracing).
"""

from __future__ import annotations

import hashlib
import os

from ...cache import disk
from .entry_cache import CacheFormatError, analyser_version, read_kept, read_marshalled, \
    write_marshalled

MAGIC = b"MTDISC01"
FORMAT = 1
SUFFIX = ".mtd"


def read_file(path: str) -> dict:
    stored = read_marshalled(path, MAGIC, FORMAT, analyser_version())
    if not isinstance(stored, dict) or any(
            not isinstance(k, int) or not isinstance(v, tuple) or len(v) != 2
            for k, v in stored.items()):
        raise CacheFormatError("unexpected content")
    return stored


def write_file(path: str, functions: dict, image=None, program=None) -> None:
    counts: dict = {"functions": len(functions)}
    if program is not None and getattr(program, "path", None):
        counts["program"] = os.path.realpath(program.path)
    write_marshalled(path, functions, MAGIC, FORMAT, analyser_version(), counts, image)


def path_of(image, program) -> str | None:
    """The file of ``image``'s list for runs of ``program`` (an image, or None:
    the binary's own list); None: no file to key it by."""
    suffix = SUFFIX
    if program is not None and getattr(program, "path", None) is not None:
        try:
            key = hashlib.sha256(disk.cache_key(program).encode()).hexdigest()[:16]
        except OSError:
            return None
        suffix = f".of-{key}{SUFFIX}"
    return disk.entry_path_of(image, suffix)


def list_entries() -> list[dict]:
    return disk.list_entries(SUFFIX, MAGIC, FORMAT)


def clear() -> tuple[int, int]:
    return disk.clear(SUFFIX)


class DiscoveryCache:
    def __init__(self, notify=None, program=lambda: None):
        """``program()``: the image of the run's main executable (None: none)."""
        self.notify = notify or (lambda message: disk.notify(message))
        self.program = program
        # module name -> (module, file path or "", {start: (end, wanted)}, grew)
        self._modules: dict[str, list] = {}
        self.stats = {"functions laid out before their first fault": 0,
                      "discovery files read": 0, "discovery files written": 0}

    def _of(self, module) -> list:
        entry = self._modules.get(module.name)
        if entry is None:
            path = path_of(module.image, self.program()) or ""
            functions: dict = {}
            if path and os.path.exists(path):
                stored, usable = read_kept(path, read_file, self.notify, "discovery cache")
                if stored is not None:
                    functions = stored
                    self.stats["discovery files read"] += 1
                if not usable:
                    path = ""
            entry = self._modules[module.name] = [module, path, functions, False]
        return entry

    def functions(self, module) -> list[tuple[int, int, tuple[int, ...]]]:
        """(start, end, wanted) of the functions earlier runs relocated in ``module``
        (run-time addresses), in address order."""
        bias = module.bias
        return [(bias + start, bias + end, tuple(bias + w for w in wanted))
                for start, (end, wanted) in sorted(self._of(module)[2].items())]

    def learnt(self, module, start: int, end: int, wanted) -> None:
        """This run relocated [start, end) of ``module``, with ``wanted`` probed."""
        entry = self._of(module)
        bias = module.bias
        key = start - bias
        kept = entry[2].get(key)
        value = (end - bias, tuple(sorted(w - bias for w in wanted)))
        if kept is None or kept[0] != value[0] or not set(value[1]) <= set(kept[1]):
            if kept is not None and kept[0] == value[0]:
                value = (value[0], tuple(sorted(set(kept[1]) | set(value[1]))))
            entry[2][key] = value
            entry[3] = True

    def save(self) -> None:
        for entry in self._modules.values():
            module, path, functions, grew = entry
            if not path or not grew:
                continue
            try:
                write_file(path, functions, module.image, self.program())
                self.stats["discovery files written"] += 1
            except OSError as exc:
                self.notify(f"discovery cache {path}: {exc.strerror}; not written")
            entry[3] = False
