# SPDX-License-Identifier: GPL-2.0-or-later
"""The symbol cache: what madtrace reads from a binary's DWARF (variables
with their types and fields, line tables), kept on disk once per binary so
that a second run loads it in milliseconds.

Where: ``$MADTRACE_CACHE_DIR``, else ``$XDG_CACHE_HOME/madtrace``, else
``~/.cache/madtrace``.  One file per binary, ``<key>.mtc``; the key is the
GNU build-id and the file size (a stripped copy keeps the build-id), or,
without a build-id, a hash of the path, size, inode and mtime.  A new build
of the binary has another key: the old entry is never read for it.

A file: ``MTCACHE1``, u32 header length, the header (JSON: format, the
binary's path, size, mtime, build-id, the payload's length and CRC-32), then
the payload (dwarf_native.py's format).  An entry whose magic, header,
length, checksum or content is wrong is corrupt: it is rebuilt and one line
says so (``notify``).

``dwarf_of(image)`` gives the ``DwarfData`` of an ``ElfImage`` (from the
cache, else read and cached).  ``prefetch(images)`` reads the binaries that
have no entry yet in a background thread (the reader is another process, at
low priority), so that the first run pays while the target runs, not after.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

from ..progress import Activity
from .dwarf_lines import LineTable
from .dwarf_native import DwarfData, DwarfFormatError, parse_dwarf, read_dwarf, summarize

MAGIC = b"MTCACHE1"
FORMAT = 1
SUFFIX = ".mtc"
NICE = 3
NT_GNU_BUILD_ID = 3


def _default_notify(message: str) -> None:
    print(f"madtrace: {message}", file=sys.stderr, flush=True)


notify = _default_notify        # how a rebuilt corrupt entry is reported (the CLI's -q: quiet)
progress_out = sys.stderr       # where a read that takes long says so (None: quiet)
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_loaded: dict[str, DwarfData] = {}
seconds = 0.0                   # spent in dwarf_of (loading, reading, waiting for a prefetch)


def cache_dir() -> str:
    explicit = os.environ.get("MADTRACE_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "madtrace")


def build_id(image) -> str | None:
    """The GNU build-id of an ElfImage (hex), or None."""
    section = image.section(".note.gnu.build-id")
    if section is None or section.size < 16:
        return None
    note = image.read(section.offset, section.size)
    try:
        namesz, descsz, kind = struct.unpack_from("<III", note, 0)
    except struct.error:
        return None
    name_end = 12 + ((namesz + 3) & ~3)
    if kind != NT_GNU_BUILD_ID or name_end + descsz > len(note):
        return None
    return note[name_end:name_end + descsz].hex()


def _source(image) -> tuple[str, os.stat_result]:
    path = os.path.realpath(image.path)
    return path, os.stat(path)


def cache_key(image) -> str:
    path, st = _source(image)
    bid = build_id(image)
    if bid:
        return f"{bid}-{st.st_size}"
    identity = f"{path}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}".encode()
    return "p-" + hashlib.sha256(identity).hexdigest()[:40]


def entry_path(image) -> str:
    return os.path.join(cache_dir(), cache_key(image) + SUFFIX)


# ------------------------------------------------------------------ entries
def entry_path_of(image, suffix: str) -> str | None:
    """Where ``image``'s entry of another kind (``suffix``) is; None: no file to
    key it by (no path, or deleted since it was mapped)."""
    if getattr(image, "path", None) is None:
        return None
    try:
        return os.path.join(cache_dir(), cache_key(image) + suffix)
    except OSError:
        return None


def unpack_arrays(header: dict, payload: bytes, at: int = 0) -> dict:
    """The numpy arrays ``header["arrays"]`` lists ((name, dtype, count), laid end to
    end from ``at``) read out of ``payload``, which they must fill to its end."""
    import numpy as np
    arrays = {}
    for name, dtype, count in header["arrays"]:
        dt = np.dtype(dtype)
        arrays[name] = np.frombuffer(payload, dt, count, at)
        at += dt.itemsize * count
    if at != len(payload):
        raise DwarfFormatError("arrays and payload differ in length")
    return arrays


def cached(image, suffix: str, magic: bytes, fmt: int, what: str, decode, build, encode):
    """(result, "read" | "written" | "built") of another kind of entry of ``image``: ``decode
    (header, payload)`` of its file, else ``build()``, written as ``encode(result)``
    -> (header, payload).  A corrupt entry is rebuilt and one line says so (``what``:
    the cache's name in it); a cache that cannot be written only costs the next
    process the build again."""
    path = entry_path_of(image, suffix)
    if path is not None and os.path.exists(path):
        try:
            return decode(*read_entry(path, magic, fmt)), "read"
        except (DwarfFormatError, OSError) as exc:
            notify(f"{what}: {path} was corrupt ({exc}); rebuilt")
    result = build()
    if path is not None:
        try:
            header, payload = encode(result)
            source = os.path.realpath(image.path)
            header.update(path=source, size=os.path.getsize(source), build_id=build_id(image),
                          created=time.time())
            write_entry(path, header, payload, magic, fmt)
            return result, "written"
        except OSError as exc:
            notify(f"{what}: cannot write {path} ({exc})")
    return result, "built"


def read_entry(path: str, magic: bytes = MAGIC, fmt: int = FORMAT) -> tuple[dict, bytes]:
    """(header, payload) of a cache file; DwarfFormatError when it is corrupt.
    ``magic`` and ``fmt``: another kind of entry's (inject/scan_cache.py)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != magic or len(data) < 12:
        raise DwarfFormatError("bad magic")
    (header_len,) = struct.unpack_from("<I", data, 8)
    try:
        header = json.loads(data[12:12 + header_len])
        payload = data[12 + header_len:]
        if header["format"] != fmt:
            raise DwarfFormatError(f"format {header['format']}")
        if len(payload) != header["payload_bytes"]:
            raise DwarfFormatError("truncated")
        if zlib.crc32(payload) != header["crc32"]:
            raise DwarfFormatError("checksum mismatch")
    except (ValueError, KeyError, TypeError) as exc:
        raise DwarfFormatError(f"bad header ({exc})") from None
    return header, payload


def write_entry(path: str, header: dict, payload: bytes, magic: bytes = MAGIC,
                fmt: int = FORMAT) -> None:
    header = dict(header, format=fmt, payload_bytes=len(payload), crc32=zlib.crc32(payload))
    raw = json.dumps(header).encode()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-",
                               suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(magic + struct.pack("<I", len(raw)) + raw + payload)
        os.replace(tmp, path)        # readers see the old entry or the whole new one
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _build(image, path: str, low_priority: bool = False) -> DwarfData:
    """Reads the binary's DWARF and writes its entry; returns what it holds."""
    source, st = _source(image)
    with tempfile.TemporaryDirectory(prefix="madtrace-dwarf-") as tmp:
        out = os.path.join(tmp, "dwarf")
        if not read_dwarf(source, out, nice=NICE if low_priority else 0):
            return DwarfData([], LineTable.empty())     # debug sections libdw finds empty
        with open(out, "rb") as f:
            payload, data = summarize(f.read())
    write_entry(path, {"path": source, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                        "build_id": build_id(image), "created": time.time()}, payload)
    return data


def _lock_for(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def dwarf_of(image, low_priority: bool = False) -> DwarfData:
    """The DWARF data of an ElfImage that has debug info (see module doc)."""
    global seconds
    started = time.perf_counter()
    try:
        return _dwarf_of(image, low_priority)
    finally:
        if threading.current_thread() is threading.main_thread():
            seconds += time.perf_counter() - started


def _dwarf_of(image, low_priority: bool) -> DwarfData:
    try:
        key = cache_key(image) if image.path is not None else None
    except OSError:                        # deleted since it was mapped: read the bytes held
        key = None
    if key is None:                        # nothing to key it by
        return _uncached(image)
    hit = _loaded.get(key)
    if hit is not None:
        return hit
    path = os.path.join(cache_dir(), key + SUFFIX)
    with _lock_for(key):                   # a prefetch of the same binary: wait for it
        hit = _loaded.get(key)
        if hit is not None:
            return hit
        data = None
        if os.path.exists(path):
            try:
                data = parse_dwarf(read_entry(path)[1])
            except DwarfFormatError as exc:
                notify(f"symbol cache: {path} was corrupt ({exc}); rebuilt")
        if data is None:
            with Activity(f"reading the debug info of {image.name} (once per binary)",
                          None if low_priority else progress_out):
                data = _build(image, path, low_priority)
        _loaded[key] = data
        return data


def _uncached(image) -> DwarfData:
    with tempfile.TemporaryDirectory(prefix="madtrace-dwarf-") as tmp:
        source, out = os.path.join(tmp, "image"), os.path.join(tmp, "dwarf")
        with open(source, "wb") as f:
            f.write(image.read(0, 1 << 62))
        if not read_dwarf(source, out):
            return DwarfData([], LineTable.empty())
        with open(out, "rb") as f:
            return parse_dwarf(f.read())


def is_cached(image) -> bool:
    return image.path is not None and os.path.exists(entry_path(image))


class Prefetch:
    """Builds the entries of ``images`` that are not cached yet, one after the
    other, from a daemon thread: each in another process (``python -m
    madtrace.binary.symcache --detached PATH``, not a child of the tracer) at
    low priority, so that neither the target nor the tracer's own thread waits
    for it.  While an entry is being
    built its key is locked: ``dwarf_of`` of that binary waits for it rather
    than reading it twice.  ``peak_rss`` is the largest child's (bytes)."""

    def __init__(self, images):
        self.images = [i for i in images if i.path is not None and i.has_debug_info]
        self.built = 0
        self.peak_rss = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, name="madtrace-dwarf", daemon=True)
        self._started = threading.Event()

    def start(self) -> "Prefetch":
        self.thread.start()
        self._started.wait()   # every key it will build is locked before anyone asks
        return self

    def _run(self) -> None:
        held = []
        try:
            for image in self.images:
                try:
                    key = cache_key(image)
                except Exception as exc:   # noqa: BLE001 - gone or unreadable: read when needed
                    self.errors.append(f"{image.name}: {exc}")
                    continue
                lock = _lock_for(key)
                if key not in _loaded and not os.path.exists(
                        os.path.join(cache_dir(), key + SUFFIX)) and lock.acquire(blocking=False):
                    held.append((image, lock))
        finally:
            self._started.set()
        for image, lock in held:
            try:
                self._build_in_child(image)
            except Exception as exc:   # noqa: BLE001 - reported; dwarf_of reads it when needed
                self.errors.append(f"{image.name}: {exc}")
            finally:
                lock.release()

    def _build_in_child(self, image) -> None:
        # the reader runs in a grandchild (``--detached``: its parent exits at once), so
        # that the tracer's waitpid(-1) never reaps it: it says how it ended on its stdout
        child = subprocess.Popen(["nice", "-n", str(NICE), sys.executable, "-m",
                                  "madtrace.binary.symcache", "--detached",
                                  os.path.realpath(image.path)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 env=dict(os.environ, MADTRACE_CACHE_DIR=cache_dir()))
        said = child.stdout.read().decode(errors="replace").strip().splitlines()
        child.stdout.close()
        try:
            child.wait()                 # the intermediate (or already reaped by the tracer)
        except ChildProcessError:
            pass
        try:
            result = json.loads(said[-1]) if said else {}
        except ValueError:
            result = {}
        if not result.get("ok"):
            raise RuntimeError(result.get("error") or "the DWARF reader ended without a word")
        self.peak_rss = max(self.peak_rss, result.get("peak_rss_bytes", 0))
        self.built += 1

    def wait(self) -> None:
        self.thread.join()


# ---------------------------------------------------------- cache list|clear
def list_entries(suffix: str = SUFFIX, magic: bytes = MAGIC, fmt: int = FORMAT) -> list[dict]:
    """Every entry of the cache: file, size, the binary it is for, whether it is
    intact.  ``suffix``, ``magic``, ``fmt``: another kind of entry's."""
    out = []
    folder = cache_dir()
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if not name.endswith(suffix) or name.startswith(".tmp-"):
            continue
        path = os.path.join(folder, name)
        entry = {"file": path, "bytes": os.path.getsize(path)}
        try:
            header, _ = read_entry(path, magic, fmt)
            entry.update(binary=header.get("path"), build_id=header.get("build_id"),
                         created=header.get("created"), ok=True)
        except (DwarfFormatError, OSError) as exc:
            entry.update(binary=None, ok=False, problem=str(exc))
        out.append(entry)
    return out


def clear(suffix: str = SUFFIX) -> tuple[int, int]:
    """Removes every entry of a kind (and leftovers of interrupted writes): (files, bytes)."""
    files = size = 0
    folder = cache_dir()
    if not os.path.isdir(folder):
        return 0, 0
    for name in os.listdir(folder):
        if name.endswith(suffix):
            path = os.path.join(folder, name)
            try:
                size += os.path.getsize(path)
                os.unlink(path)
                files += 1
            except OSError:
                pass
    if suffix == SUFFIX:
        _loaded.clear()
    return files, size


def main(args: list[str]) -> int:
    """``python -m madtrace.binary.symcache [--detached] PATH...``: builds their
    entries (Prefetch's reader); with --detached in a grandchild, and one JSON
    line on stdout at the end: ok, error, the peak RSS of it and its reader."""
    import resource
    from .elf import ElfImage
    detached = bool(args) and args[0] == "--detached"
    if detached:
        args = args[1:]
        if os.fork():
            os._exit(0)
    result = {"ok": True}
    try:
        for path in args:
            image = ElfImage.load(path)
            if image.has_debug_info:
                dwarf_of(image)
    except Exception as exc:   # noqa: BLE001 - reported to the tracer, which reads it later
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["peak_rss_bytes"] = 1024 * max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
