# SPDX-License-Identifier: GPL-2.0-or-later
"""The copier's per-instruction entries kept on disk, once per binary.

The hybrid engine's copier analyses each distinct instruction of a function
it copies (arch/x86_64/insn_entries.py ``Entry``: what the instruction is, its
re-encoding, its probe plan), by its bytes only: an ``Entry`` does not depend
on where the instruction is.  Within a process each distinct byte string is
analysed once; this cache keeps them across runs: python3 running a short
script copies ~1 200 functions, whose analysis was half of the tracer's time,
three quarters of it these entries.

Where: the cache's directory (cache/disk.py ``cache_dir``), one
file per binary, ``<key>.mti``, the key the symbol cache's (build-id and
size), in its container (cache/disk.py): ``MTINSN01``, u32 header
length, the header (JSON: format, the analyser's version, the binary's path
and build-id, the payload's length and CRC-32), then the payload:
``marshal`` of {bytes: the entry's fields} (plain values: marshal builds
them ~10x faster than pickle builds the objects; the rare indirect jump's
instruction view and an entry's error are pickled inside).  The version is a hash of the copier's source
(madtrace/arch/x86_64/*.py) and capstone's version: another madtrace or
capstone never reads an entry made by this one.  A file whose magic, header,
length, checksum or content is wrong is rebuilt, and one line says so; a file
not owned by the user running madtrace is not read (pickle runs code).

``EntryCache.prepare(module)`` loads the module's entries into the copier's
index before the first copy in that module; ``used(module, analysis)``
notes those a copy needed; ``save()`` writes each module whose file lacks
some of them (at the end of data tracing).
"""

from __future__ import annotations

import hashlib
import marshal
import os
import pickle
import time
from dataclasses import fields
from typing import Any

import capstone

from ...arch.x86_64 import insn_entries
from ...arch.x86_64.insn_entries import Entry, ProbePlan
from ...arch.x86_64.memops import MemInstruction, MemOperand
from ...cache import disk
from ...cache.disk import CorruptEntry

MAGIC = b"MTINSN01"
FORMAT = 5
SUFFIX = ".mti"
_ARCH_DIR = os.path.dirname(os.path.abspath(insn_entries.__file__))
_version: str | None = None


def analyser_version() -> str:
    """A hash of the copier's source and of capstone's version."""
    global _version
    if _version is None:
        h = hashlib.sha256(capstone.__version__.encode())
        for name in sorted(os.listdir(_ARCH_DIR)):
            if name.endswith(".py"):
                with open(os.path.join(_ARCH_DIR, name), "rb") as f:
                    h.update(name.encode() + b"\0" + f.read())
        _version = h.hexdigest()[:32]
    return _version


class CacheFormatError(ValueError):
    pass


def read_marshalled(path: str, magic: bytes, fmt: int, version: str):
    """The value kept in a cache file of the copier (this one's, analysis_cache.py's);
    CacheFormatError when it is damaged, from another analyser, or not the
    user's own."""
    if os.stat(path).st_uid != os.geteuid():
        raise CacheFormatError("not owned by this user")
    try:
        header, payload = disk.read_entry(path, magic, fmt)
    except CorruptEntry as exc:
        raise CacheFormatError(str(exc)) from None
    if header.get("analyser") != version:
        raise CacheFormatError("another analyser")      # not damage: replaced quietly
    try:
        return marshal.loads(payload)
    except (ValueError, EOFError, TypeError) as exc:
        raise CacheFormatError(f"bad content ({exc})") from None


def write_marshalled(path: str, value, magic: bytes, fmt: int, version: str, counts: dict,
                     image=None) -> None:
    """``value`` (plain values) in a cache file; ``image``: the binary it is of."""
    header: dict = {"analyser": version, **counts, "created": time.time()}
    if image is not None and getattr(image, "path", None):
        header.update(path=os.path.realpath(image.path), build_id=disk.build_id(image))
    disk.write_entry(path, header, marshal.dumps(value), magic, fmt)


def read_file(path: str) -> dict:
    """{bytes: the entry's fields (``restore`` makes the Entry)} of a cache file."""
    stored = read_marshalled(path, MAGIC, FORMAT, analyser_version())
    if not isinstance(stored, dict) or (stored and not isinstance(next(iter(stored)), bytes)):
        raise CacheFormatError("unexpected content")
    return stored


def write_file(path: str, encoded: dict, image=None) -> None:
    """``encoded``: {bytes: ``encode(entry)``}; ``image``: the binary they are of."""
    write_marshalled(path, encoded, MAGIC, FORMAT, analyser_version(), {"entries": len(encoded)},
                     image)


def list_entries() -> list[dict]:
    return disk.list_entries(SUFFIX, MAGIC, FORMAT)


def clear() -> tuple[int, int]:
    return disk.clear(SUFFIX)


# a plan's kept fields, in ProbePlan's order (not the pieces made for one set of templates)
_PLAN = tuple(f.name for f in fields(ProbePlan) if f.compare)


def encode(e: Entry) -> tuple:
    """An entry's fields as plain values (what one process's copier hangs on a probe
    plan, the pieces made for its templates, function_copy.py, is left out)."""
    mem = None if e.mem is None else (
        e.mem.address, e.mem.size, e.mem.mnemonic, e.mem.text,
        tuple((o.base, o.index, o.scale, o.disp, o.segment, o.size, o.load, o.store)
              for o in e.mem.operands), e.mem.rep, e.mem.atomic)
    plan = None if e.plan is None else tuple(getattr(e.plan, name) for name in _PLAN)
    rare = pickle.dumps((e.view, e.error), protocol=5) if e.view is not None or \
        e.error is not None else None
    return (e.size, e.kind, e.call, e.mnemonic, e.text, e.planned, e.rel, e.head, e.head_why,
            e.size_why, e.stub_why, e.rip_field, e.rip_disp, e.rip_why, e.piece, e.row, mem,
            plan, rare, e.r11)


def restore(f: tuple) -> Entry:
    e = Entry(f[0], f[1], f[2], f[3], f[4])
    (e.planned, e.rel, e.head, e.head_why, e.size_why, e.stub_why, e.rip_field, e.rip_disp,
     e.rip_why, e.piece, e.row) = f[5:16]
    mem, plan, rare, e.r11 = f[16], f[17], f[18], f[19]
    if mem is not None:
        e.mem = MemInstruction(mem[0], mem[1], mem[2], mem[3],
                               tuple(MemOperand(*o) for o in mem[4]), mem[5], mem[6])
    if plan is not None:
        e.plan = ProbePlan(*plan)
    if rare is not None:
        e.view, e.error = pickle.loads(rare)
    return e


# files the resident process read before forking a worker (daemon/resident.py
# ``warm_copier``), their entries given to the copier's index: path -> (stamp, the
# bytes of their instructions)
_preloaded: dict[str, tuple] = {}
PRELOAD_MAX = 32        # files of each kind the resident process keeps read (python3's: 15 MB)


def stamp(path: str | None) -> tuple[int, int] | None:
    """(mtime_ns, size) of a cache file; None: there is none."""
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size) if st is not None else None


def read_kept(path: str, read, notify, what: str) -> tuple:
    """(``read(path)`` or None, whether the file can be written later).  A damaged
    file is said in one line and rebuilt; another analyser's or another user's
    is replaced quietly; one that cannot be read is said and not used."""
    try:
        return read(path), True
    except CacheFormatError as exc:
        if str(exc) not in ("another analyser", "not owned by this user"):
            notify(f"{what} {path}: {exc}; rebuilt")
        return None, True
    except OSError as exc:
        notify(f"{what} {path}: {exc.strerror}; not used")
        return None, False


def read_if_changed(preloaded: dict, image, suffix: str, read) -> tuple | None:
    """(path, stamp, content read by ``read``) of ``image``'s cache file of kind
    ``suffix``; None when there is none, it cannot be read, or ``preloaded`` has
    it from the same stamp."""
    path = disk.entry_path_of(image, suffix)
    now = stamp(path)
    if path is None or now is None or preloaded.get(path, (None,))[0] == now or \
            (path not in preloaded and len(preloaded) >= PRELOAD_MAX):
        return None
    try:
        return path, now, read(path)
    except (OSError, CacheFormatError):
        return None


def preload(image) -> None:
    """Read ``image``'s file now (the resident process), unless read already and
    unchanged since."""
    got = read_if_changed(_preloaded, image, SUFFIX, read_file)
    if got is not None:
        path, now, stored = got
        insn_entries.store(stored, restore)
        _preloaded[path] = (now, set(stored))


class EntryCache:
    def __init__(self, notify=None):
        # as the symbol cache says it (one line, not under -q: recording/recording.py)
        self.notify = notify or (lambda message: disk.notify(message))
        self._modules: dict[str, tuple[Any, str, set[bytes], set[bytes]]] = {}
        self.stats = {"loaded": 0, "files_read": 0, "files_written": 0}

    def prepare(self, module) -> None:
        """The module's cached entries in the copier's index (once per module)."""
        if module.name in self._modules:
            return
        path = disk.entry_path_of(module.image, SUFFIX) or ""
        known: set[bytes] = set()
        kept = _preloaded.get(path)
        if kept is not None and kept[0] == stamp(path):
            known = set(kept[1])            # in the copier's index already
            self.stats["loaded"] += len(known)
            self.stats["files_read"] += 1
        elif path and os.path.exists(path):
            stored, usable = read_kept(path, read_file, self.notify, "copier cache")
            if stored is not None:
                insn_entries.store(stored, restore)   # made into entries when needed
                known = set(stored)
                self.stats["loaded"] += len(stored)
                self.stats["files_read"] += 1
            if not usable:
                path = ""
        self._modules[module.name] = (module, path, known, set())

    def used(self, module, raws) -> None:
        """The instructions a copy in ``module`` needed (their bytes)."""
        entry = self._modules.get(module.name)
        if entry is not None:
            entry[3].update(raws)

    def save(self) -> None:
        """Each module whose file lacks some of the entries its copies needed."""
        index = insn_entries.analysed
        for module, path, known, used in self._modules.values():
            new = used - known
            if not path or not new:
                continue
            stored = insn_entries.kept_entries
            encoded = {raw: encode(index[raw]) if raw in index else stored[raw]
                       for raw in known | used if raw in index or raw in stored}
            try:
                write_file(path, encoded, module.image)
                self.stats["files_written"] += 1
            except OSError as exc:
                self.notify(f"copier cache {path}: {exc.strerror}; not written")
            known.update(new)
