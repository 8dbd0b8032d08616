# SPDX-License-Identifier: GPL-2.0-or-later
"""The cache's engine: where entries go, how a binary is keyed, and the file
every entry is (whatever it holds).

Where: ``$MADTRACE_CACHE_DIR``, else ``$XDG_CACHE_HOME/madtrace``, else
``~/.cache/madtrace``.  One file per binary and kind, ``<key><suffix>``; the
key is the GNU build-id and the file size (a stripped copy keeps the
build-id), or, without a build-id, a hash of the path, size, inode and mtime.
A new build of the binary has another key: the old entry is never read for it.

A file: the kind's 8-byte magic, u32 header length, the header (JSON: the
kind's format, the binary's path, size, build-id, the payload's length and
CRC-32), then the payload.  An entry whose magic, header, length, checksum or
content is wrong is corrupt (``CorruptEntry``): it is rebuilt and one line
says so (``notify``).  Writes go to a temporary file renamed over the entry,
so readers see the old entry or the whole new one.

An image is anything with ``path``, ``section(name)`` and ``read(offset, size)``
(binary/elf.py's ElfImage): this package imports nothing of madtrace's.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
import time
import zlib

NT_GNU_BUILD_ID = 3


class CorruptEntry(ValueError):
    """A cache file that is not what its writer wrote."""


def _default_notify(message: str) -> None:
    print(f"madtrace: {message}", file=sys.stderr, flush=True)


notify = _default_notify        # how a rebuilt corrupt entry is reported (a recording's log)


def cache_dir() -> str:
    explicit = os.environ.get("MADTRACE_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "madtrace")


def build_id(image) -> str | None:
    """The GNU build-id of an image (hex), or None."""
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


def source_of(image) -> tuple[str, os.stat_result]:
    """The binary's real path and its stat."""
    path = os.path.realpath(image.path)
    return path, os.stat(path)


def cache_key(image) -> str:
    path, st = source_of(image)
    bid = build_id(image)
    if bid:
        return f"{bid}-{st.st_size}"
    identity = f"{path}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}".encode()
    return "p-" + hashlib.sha256(identity).hexdigest()[:40]


def entry_path_of(image, suffix: str) -> str | None:
    """Where ``image``'s entry of a kind (``suffix``) is; None: no file to key it by
    (no path, or deleted since it was mapped)."""
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
        raise CorruptEntry("arrays and payload differ in length")
    return arrays


def cached(image, suffix: str, magic: bytes, fmt: int, what: str, decode, build, encode):
    """(result, "read" | "written" | "built") of an entry of ``image``: ``decode
    (header, payload)`` of its file, else ``build()``, written as ``encode(result)``
    -> (header, payload).  A corrupt entry is rebuilt and one line says so (``what``:
    the cache's name in it); a cache that cannot be written only costs the next
    process the build again."""
    path = entry_path_of(image, suffix)
    if path is not None and os.path.exists(path):
        try:
            return decode(*read_entry(path, magic, fmt)), "read"
        except (CorruptEntry, OSError) as exc:
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


def read_entry(path: str, magic: bytes, fmt: int) -> tuple[dict, bytes]:
    """(header, payload) of a cache file of the kind ``magic``, format ``fmt``;
    CorruptEntry when it is corrupt."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != magic or len(data) < 12:
        raise CorruptEntry("bad magic")
    (header_len,) = struct.unpack_from("<I", data, 8)
    try:
        header = json.loads(data[12:12 + header_len])
        payload = data[12 + header_len:]
        if header["format"] != fmt:
            raise CorruptEntry(f"format {header['format']}")
        if len(payload) != header["payload_bytes"]:
            raise CorruptEntry("truncated")
        if zlib.crc32(payload) != header["crc32"]:
            raise CorruptEntry("checksum mismatch")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptEntry(f"bad header ({exc})") from None
    return header, payload


def write_entry(path: str, header: dict, payload: bytes, magic: bytes, fmt: int) -> None:
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


def list_entries(suffix: str, magic: bytes, fmt: int) -> list[dict]:
    """Every entry of a kind: file, size, the binary it is for, whether it is intact."""
    out: list[dict] = []
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
            if header.get("program"):       # a list kept per program (discovery_cache.py)
                entry["program"] = header["program"]
        except (CorruptEntry, OSError) as exc:
            entry.update(binary=None, ok=False, problem=str(exc))
        out.append(entry)
    return out


def clear(suffix: str) -> tuple[int, int]:
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
    return files, size
