"""The trace directory.

Layout (version 1):
  meta.json        one JSON object: format version, command or attached PID,
                   exit status, threads, modules and symbol counts, counters
  maps.start.txt   /proc/PID/maps when tracing began (after the loader mapped
                   the program's libraries, or at attach time)
  maps.end.txt     /proc/PID/maps just before the target exited or was detached
Later engines add their event files beside these; ``meta.json`` lists them.
A directory is never overwritten unless ``force`` is given.
"""

from __future__ import annotations

import json
import os
import shutil

from ..errors import CorruptTraceError, OutputExistsError, writing

FORMAT_VERSION = 1
META = "meta.json"


def create_trace_dir(path: str, force: bool) -> str:
    with writing(path):
        return _create_trace_dir(path, force)


def _create_trace_dir(path: str, force: bool) -> str:
    if os.path.lexists(path):
        if not force:
            raise OutputExistsError(f"{path} already exists (use --force to overwrite it)")
        if os.path.isdir(path) and not os.path.islink(path):
            if not os.path.exists(os.path.join(path, META)) and os.listdir(path):
                raise OutputExistsError(
                    f"{path} exists and is not a madtrace trace directory; not overwriting it")
            shutil.rmtree(path)
        else:
            os.unlink(path)
    os.makedirs(path)
    return path


def default_trace_dir(base: str = "madtrace.data") -> str:
    """``madtrace.data``, or ``madtrace.data.N`` for the first N that is free."""
    if not os.path.lexists(base):
        return base
    n = 1
    while os.path.lexists(f"{base}.{n}"):
        n += 1
    return f"{base}.{n}"


def per_thread_files(directory: str, subdir: str, extension: str) -> list[tuple[int, str]]:
    """(tid, path) of every ``subdir/<tid><extension>`` of a trace directory, by tid."""
    folder = os.path.join(directory, subdir)
    if not os.path.isdir(folder):
        return []
    found = []
    for name in os.listdir(folder):
        stem, ext = os.path.splitext(name)
        if ext == extension and stem.isdigit():
            found.append((int(stem), os.path.join(folder, name)))
    return sorted(found)


def record_file_sizes(directory: str) -> dict[str, int]:
    """{name: bytes} of the call record files (calls/<tid>.rec) written so far."""
    return {os.path.basename(path): os.path.getsize(path)
            for _, path in per_thread_files(directory, "calls", ".rec")}


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
            return [n for n in names if n.startswith(META) or n in ("calls", "store")]
        return []
    shutil.copytree(source, destination, dirs_exist_ok=True, ignore=ignore)
    if record_sizes:
        os.makedirs(os.path.join(destination, "calls"), exist_ok=True)
    for name, size in record_sizes.items():
        _copy_prefix(os.path.join(source, "calls", name), os.path.join(destination, "calls", name),
                     size)


def write_text(path: str, name: str, text: str) -> None:
    with writing(os.path.join(path, name)), open(os.path.join(path, name), "w") as f:
        f.write(text)


def write_meta(path: str, meta: dict) -> None:
    meta = dict(meta, format_version=FORMAT_VERSION)
    tmp = os.path.join(path, META + ".tmp")
    with writing(tmp):
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, os.path.join(path, META))


def read_meta(path: str) -> dict:
    if not os.path.isdir(path):
        raise CorruptTraceError(f"{path}: no such trace directory")
    meta_path = os.path.join(path, META)
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise CorruptTraceError(f"{path}: not a madtrace trace directory (no {META})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptTraceError(f"{meta_path}: corrupt ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        raise CorruptTraceError(
            f"{meta_path}: unsupported or missing format_version (expected {FORMAT_VERSION})")
    from .partial import settle      # a recording whose tracer died: what reached the disk
    return settle(meta, path)
