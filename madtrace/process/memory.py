"""Target memory I/O through /proc/PID/mem.

One pread/pwrite moves any number of bytes (16 B in ~0.7 us, 4 KiB in ~1 us
on these machines, versus ~3 us and ~790 us for PTRACE_PEEKDATA words), and
writes go through FOLL_FORCE, so read-only text can be patched.  Exactly the
bytes asked for are written: no word-sized read-modify-write (pitfall 9).
"""

from __future__ import annotations

import errno
import os
import struct

from ..errors import NoSuchProcessError, PermissionDeniedError, TargetMemoryError


class ProcessMemory:
    """Reads and writes the address space of one process (any of its threads)."""

    def __init__(self, pid: int):
        self.pid = pid
        try:
            self._fd = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NoSuchProcessError(f"no such process: {pid}") from None
        except PermissionError:
            raise PermissionDeniedError(f"cannot open /proc/{pid}/mem: permission denied") from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def read(self, addr: int, size: int) -> bytes:
        try:
            data = os.pread(self._fd, size, addr)
        except OSError as exc:
            raise self._error("read", addr, size, exc) from None
        if len(data) != size:
            # short read: the range runs into an unmapped page
            raise TargetMemoryError(
                f"cannot read {size} bytes at {addr:#x} in process {self.pid}: "
                f"only {len(data)} readable")
        return data

    def write(self, addr: int, data: bytes) -> None:
        try:
            written = os.pwrite(self._fd, data, addr)
        except OSError as exc:
            raise self._error("write", addr, len(data), exc) from None
        if written != len(data):
            raise TargetMemoryError(
                f"cannot write {len(data)} bytes at {addr:#x} in process {self.pid}: "
                f"only {written} written")

    def read_u64(self, addr: int) -> int:
        return struct.unpack("<Q", self.read(addr, 8))[0]

    def write_u64(self, addr: int, value: int) -> None:
        self.write(addr, struct.pack("<Q", value & 0xFFFFFFFFFFFFFFFF))

    def read_cstring(self, addr: int, limit: int = 4096) -> bytes:
        out = b""
        while len(out) < limit:
            # never cross a page boundary in one read: the next page may be unmapped
            chunk = min(256, 4096 - ((addr + len(out)) & 4095), limit - len(out))
            data = self.read(addr + len(out), chunk)
            nul = data.find(b"\0")
            if nul >= 0:
                return out + data[:nul]
            out += data
        return out

    def map_in(self, addr: int, size: int, page: int = 4096) -> None:
        """Maps the pages of a shared mapping into the process's page tables, while it
        runs: a read through /proc/PID/mem faults each page in as the process's own
        read would, and a page of a shared writable mapping is mapped writable.  Its
        first write then takes no page fault.  Best effort: an unreadable page ends
        it."""
        for at in range(addr, addr + size, page):
            try:
                os.pread(self._fd, 1, at)
            except OSError:
                return

    def _error(self, what: str, addr: int, size: int, exc: OSError) -> Exception:
        if exc.errno == errno.ESRCH:
            return NoSuchProcessError(f"process {self.pid} is gone")
        if exc.errno in (errno.EIO, errno.EFAULT):
            return TargetMemoryError(
                f"cannot {what} {size} bytes at {addr:#x} in process {self.pid}: not mapped")
        if exc.errno in (errno.EPERM, errno.EACCES):
            return PermissionDeniedError(f"cannot {what} memory of process {self.pid}: {exc.strerror}")
        return TargetMemoryError(f"cannot {what} {size} bytes at {addr:#x}: {exc.strerror}")
