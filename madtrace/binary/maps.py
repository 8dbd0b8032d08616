# SPDX-License-Identifier: GPL-2.0-or-later
"""Parsing of ``/proc/PID/maps`` and reading of ``/proc/PID/mem``.

API
---
``Mapping``
    Frozen dataclass for one line of the maps file: ``start``, ``end``
    (exclusive), ``perms`` (``"r-xp"``), ``offset`` (file offset), ``dev``
    (``"fd:01"``), ``inode`` (int) and ``path`` (``""`` for anonymous
    memory, ``"[heap]"``, ``"[stack]"``, ``"[vdso]"``... for special ones).
    Helpers: ``size``, ``is_file``, ``is_special``, ``deleted``,
    ``contains(addr)``, ``label`` (short region name: file basename,
    ``[heap]``, ``anon``...).
``parse_maps(text) -> list[Mapping]``
    Parse the text of a maps file (lines that do not parse are skipped).
``read_maps(pid) -> list[Mapping]``
    Read and parse ``/proc/PID/maps``.  Raises ``NoSuchProcessError`` when
    the process does not exist and ``PermissionDeniedError`` when access is
    refused.

Target memory itself is read by ``madtrace.process.memory`` only.
"""

from __future__ import annotations

import bisect
import errno
import os
from dataclasses import dataclass

from madtrace.errors import NoSuchProcessError, PermissionDeniedError

_DELETED = " (deleted)"


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    dev: str
    inode: int
    path: str

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def deleted(self) -> bool:
        return self.path.endswith(_DELETED)

    @property
    def file_path(self) -> str:
        """The path without a trailing `` (deleted)`` marker."""
        if self.deleted:
            return self.path[: -len(_DELETED)]
        return self.path

    @property
    def is_file(self) -> bool:
        return self.path.startswith("/")

    @property
    def is_special(self) -> bool:
        return self.path.startswith("[")

    @property
    def label(self) -> str:
        """Short region name: ``[heap]``, ``[stack]``, ``anon``, file basename."""
        if not self.path:
            return "anon"
        if self.is_file:
            return os.path.basename(self.file_path)
        return self.path

    def contains(self, addr: int) -> bool:
        return self.start <= addr < self.end


def parse_maps(text: str) -> list[Mapping]:
    """Parse the contents of a ``/proc/PID/maps`` file."""
    out: list[Mapping] = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        try:
            lo, hi = parts[0].split("-", 1)
            start = int(lo, 16)
            end = int(hi, 16)
            offset = int(parts[2], 16)
            inode = int(parts[4])
        except ValueError:
            continue
        if len(parts[1]) != 4:
            continue            # not a maps line (a saved map that was damaged)
        path = parts[5].strip() if len(parts) > 5 else ""
        out.append(Mapping(start, end, parts[1], offset, parts[3], inode, path))
    out.sort(key=lambda m: m.start)
    return out


def _check_pid(pid) -> int:
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        raise NoSuchProcessError(f"invalid process id: {pid!r}") from None
    if pid <= 0:
        raise NoSuchProcessError(f"invalid process id: {pid}")
    return pid


def image_mappings(maps: list[Mapping]) -> tuple:
    """What an AddressSpace is made of (the file mappings and the vdso), to tell
    whether one loaded earlier still describes the process."""
    return tuple((m.start, m.end, m.perms, m.offset, m.dev, m.inode, m.path)
                 for m in maps if (m.is_file and m.inode) or m.path == "[vdso]")


def unmapped_parts(start: int, end: int, maps: list[Mapping]) -> list[tuple[int, int]]:
    """The parts of [start, end) that no mapping of ``maps`` (sorted) covers."""
    out, at = [], start
    i = bisect.bisect_right([m.end for m in maps], start)
    while i < len(maps) and maps[i].start < end:
        if maps[i].start > at:
            out.append((at, maps[i].start))
        at = max(at, maps[i].end)
        i += 1
    if at < end:
        out.append((at, end))
    return out


def read_maps(pid: int) -> list[Mapping]:
    """Return the memory mappings of process *pid*, sorted by start address."""
    pid = _check_pid(pid)
    try:
        with open(f"/proc/{pid}/maps", "r", encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        raise NoSuchProcessError(f"no such process: {pid}") from None
    except PermissionError:
        raise PermissionDeniedError(f"cannot read /proc/{pid}/maps: permission denied") from None
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT):
            raise NoSuchProcessError(f"no such process: {pid}") from None
        raise PermissionDeniedError(f"cannot read /proc/{pid}/maps: {e.strerror}") from None
    return parse_maps(text)
