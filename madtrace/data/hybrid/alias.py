# SPDX-License-Identifier: GPL-2.0-or-later
"""Traced memory mapped twice (the hybrid data engine's second mapping).

Traced pages stay protected at their own addresses, so that an instruction
nothing has rewritten yet faults (discovery).  Rewritten code (probes) and
system calls reach the same bytes through an *alias*: the memory is backed
by a memfd mapped MAP_SHARED at its own address and again, read-write, at
``address ^ ALIAS_BIT`` (bit 45: the image of the executable and the heap,
at 0x55.., lies at 0x75..; that of the libraries, at 0x7f.., at 0x5f..; that
of a non-PIE executable, at 0x40_0000, at 0x2000_0040_0000).  An address
whose image is taken is not aliased (``refused``) and keeps the fault path.

The alias is made by ``mremap(start, 0, len, MAYMOVE|FIXED, start ^ BIT)``
(a second mapping of the same shared pages), so no file descriptor stays
open in the target; it is MADV_DONTFORK, so a fork child never has it.

``bits``: one bit per page of the user address space (a sparse 4 GiB memfd,
read by the probes, written by the tracer): set while the page is aliased
and its own protection allows loads and stores; a probe whose address has
its bit clear accesses the address itself.  Clearing the bits (detach,
tracer death, a vfork window) turns every probe back into the plain
instruction.

What the program sees stays as without madtrace (``AliasMap`` keeps it so
when the engine reports its system calls): brk growth and shrink, its own
mmap/munmap/mremap/mprotect, MADV_DONTNEED/MADV_FREE reading zeros
(``zero``: MADV_REMOVE of the alias), a fork child getting private copies
(``privatize``: the same mappings as the program made, file-backed where
they were, with the contents of now), and detach (``privatize`` in the
target itself).  /proc/PID/maps shows ``/memfd:madtrace-alias (deleted)``
for aliased ranges and their images; ``maps_view`` gives the program's own
view, for the trace directory.  Each aliased range costs one more mapping
(vm.max_map_count, 65530 by default): past ``MAX_ALIASES`` new ranges are
refused.
"""

from __future__ import annotations

import bisect
import os
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from ...binary.maps import Mapping, parse_maps, unmapped_parts
from ...target.areas import SharedArea
from ...trace.format import PAGE
from ...process.remote_syscall import (MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, MAP_SHARED,
                                       PROT_READ, PROT_WRITE, RemoteSyscalls)

ALIAS_BIT = 1 << 45
MEMFD_SIZE = 1 << 40                 # sparse: room for any growth of the range
BITMAP_BYTES = 1 << 32               # one bit per page of the 47-bit user address space
MAP_NORESERVE = 0x4000
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
MADV_REMOVE, MADV_DONTFORK, MADV_DOFORK = 9, 10, 11
MFD_CLOEXEC = 1
O_RDONLY = 0
MAX_ALIASES = 16384
NAME = b"madtrace-alias"


def page_up(n: int) -> int:
    return (n + PAGE - 1) & ~(PAGE - 1)


def start_brk(pid: int) -> int:
    """Where the process's brk heap begins (/proc/PID/stat, field 47)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[44])



def set_page_bit(bits: np.ndarray, page: int, on: bool) -> None:
    """Bit ``page`` of a page bitmap (bit p % 8 of byte p // 8) on or off."""
    mask = 1 << (page % 8)
    if on:
        bits[page // 8] |= mask
    else:
        bits[page // 8] &= ~mask & 0xFF


def set_page_bits(bits: np.ndarray, start: int, end: int, on: bool) -> None:
    """The bits of pages [start, end) (page aligned) of a page bitmap: whole bytes
    at once, the ragged ends bit by bit."""
    first, last = start // PAGE, end // PAGE
    while first < last and first % 8:
        set_page_bit(bits, first, on)
        first += 1
    while last > first and last % 8:
        last -= 1
        set_page_bit(bits, last, on)
    if first < last:
        bits[first // 8:last // 8] = 0xFF if on else 0

class Spans:
    """Sorted, disjoint [start, end) ranges."""

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __iter__(self):
        return iter(list(zip(self.starts, self.ends)))

    def __len__(self) -> int:
        return len(self.starts)

    def overlapping(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) that are in the set."""
        i = max(bisect.bisect_right(self.starts, start) - 1, 0)
        out = []
        while i < len(self.starts) and self.starts[i] < end:
            lo, hi = max(self.starts[i], start), min(self.ends[i], end)
            if lo < hi:
                out.append((lo, hi))
            i += 1
        return out

    def covers(self, start: int, end: int) -> bool:
        i = bisect.bisect_right(self.starts, start) - 1
        return i >= 0 and self.ends[i] >= end and start < self.ends[i]

    def add(self, start: int, end: int) -> None:
        self.remove(start, end)
        i = bisect.bisect_left(self.starts, start)
        self.starts.insert(i, start)
        self.ends.insert(i, end)
        # merge with touching neighbours
        if i + 1 < len(self.starts) and self.starts[i + 1] == end:
            self.ends[i] = self.ends.pop(i + 1)
            self.starts.pop(i + 1)
        if i > 0 and self.ends[i - 1] == start:
            self.ends[i - 1] = self.ends.pop(i)
            self.starts.pop(i)

    def remove(self, start: int, end: int) -> None:
        kept = [(s, e) for s, e in zip(self.starts, self.ends) if e <= start or s >= end]
        for s, e in zip(self.starts, self.ends):
            if s < start < e:
                kept.append((s, start))
            if s < end < e:
                kept.append((end, e))
        kept.sort()
        self.starts = [s for s, _ in kept]
        self.ends = [e for _, e in kept]


@dataclass(frozen=True)
class Origin:
    """What the program had mapped at [start, end): a file (its path and the file
    offset at ``start``) or anonymous memory (``path`` "" or "[heap]")."""
    start: int
    end: int
    path: str = ""
    offset: int = 0
    dev: str = "00:00"
    inode: int = 0

    def clipped(self, start: int, end: int) -> "Origin":
        lo, hi = max(start, self.start), min(end, self.end)
        return replace(self, start=lo, end=hi, offset=self.offset + (lo - self.start))

    @property
    def is_file(self) -> bool:
        return self.path.startswith("/")


def origins_in(mappings: list[Mapping], start: int, end: int) -> list[Origin]:
    """What the program has mapped in [start, end), from /proc/PID/maps."""
    out = []
    for m in mappings:
        if m.start < end and start < m.end:
            path = m.file_path if m.is_file else m.path
            out.append(Origin(m.start, m.end, path, m.offset, m.dev, m.inode).clipped(start, end))
    return out


class AliasMap:
    def __init__(self, tracee, rs: RemoteSyscalls):
        self.tracee = tracee
        # with the copies whose probes read it (rewriting.GROUP)
        self.bitmap = SharedArea(rs, BITMAP_BYTES, "madtrace-bitmap", executable=False,
                                 group="madtrace-rewriting")
        self.bits = np.frombuffer(self.bitmap.local, dtype=np.uint8)
        self.spans = Spans()            # aliased ranges, at the program's addresses
        self.origins: list[Origin] = []
        self.refused: Counter = Counter()
        self.active = True
        self.start_brk = start_brk(tracee.pid)

    # ------------------------------------------------------------- queries
    def image(self, address: int) -> int:
        return address ^ ALIAS_BIT

    def covers(self, start: int, end: int) -> bool:
        """Every byte of [start, end) is aliased."""
        return end > start and self.spans.covers(start & ~(PAGE - 1), page_up(end))

    def usable(self, start: int, end: int) -> bool:
        """Every page of [start, end) is aliased and open to loads and stores (its bit)."""
        if not self.covers(start, end):
            return False
        first, last = start // PAGE, (end - 1) // PAGE
        return all(self.bits[p // 8] >> (p % 8) & 1 for p in range(first, last + 1))

    def aliased_pages(self) -> int:
        return sum(e - s for s, e in self.spans) // PAGE

    def report(self) -> dict:
        return {"ranges": len(self.spans), "pages": self.aliased_pages(),
                "refused": dict(self.refused)}

    # ---------------------------------------------------------------- bits
    def set_bits(self, start: int, end: int, on: bool) -> None:
        """Pages [start, end) (page aligned) readable and writable through the alias."""
        set_page_bits(self.bits, start, end, on)

    def _bit(self, page: int, on: bool) -> None:
        set_page_bit(self.bits, page, on)

    def update_access(self, protections: dict[int, int], pages=None) -> None:
        """The bit of each aliased page (all of them, or ``pages``): on iff the
        program's own protection of the page (``protections``) allows loads and stores."""
        if pages is None:
            pages = [p for s, e in self.spans for p in range(s, e, PAGE)]
        for page in pages:
            if self.spans.covers(page, page + PAGE):
                self._bit(page // PAGE, protections.get(page, 0) & 3 == 3)
            else:
                self._bit(page // PAGE, False)

    # ------------------------------------------------------------ aliasing
    def _image_free(self, start: int, end: int, mappings: list[Mapping]) -> bool:
        lo, hi = start ^ ALIAS_BIT, (end - 1) ^ ALIAS_BIT
        if lo > hi or hi >= 1 << 47:
            return False
        return not any(m.start <= hi and lo < m.end for m in mappings)

    def _memfd(self, rs: RemoteSyscalls) -> int:
        scratch = (rs.saved_regs.rsp - 4096) & ~15
        self.tracee.mem.write(scratch, NAME + b"\0")
        fd = rs.call("memfd_create", scratch, MFD_CLOEXEC)
        try:
            rs.call("ftruncate", fd, MEMFD_SIZE)
        except BaseException:
            rs.call("close", fd, check=False)
            raise
        return fd

    def alias(self, rs: RemoteSyscalls, start: int, end: int, origins: list[Origin],
              mappings: list[Mapping], fresh: bool = False) -> bool:
        """Back [start, end) (page aligned, every thread that may touch it stopped)
        with shared memory mapped twice; the contents stay (``fresh``: the range
        was just mapped and holds zeros).  False (and a reason in ``refused``) if
        the range keeps its memory as it is."""
        if not self.active:
            return False
        if len(self.spans) >= MAX_ALIASES:
            self.refused["vm.max_map_count budget"] += 1
            return False
        if not self._image_free(start, end, mappings):
            self.refused["alias address taken"] += 1
            return False
        image = start ^ ALIAS_BIT
        pages = {} if fresh else self._contents(start, end)
        fd = self._memfd(rs)
        try:
            rs.mmap(start, end - start, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
            for address, data in pages.items():
                self.tracee.mem.write(address, data)
            rs.call("mremap", start, 0, end - start, MREMAP_MAYMOVE | MREMAP_FIXED, image)
            rs.call("madvise", image, end - start, MADV_DONTFORK)
        finally:
            rs.call("close", fd, check=False)
        self.spans.add(start, end)
        self._add_origins(start, end, origins)
        return True

    def _contents(self, start: int, end: int) -> dict[int, bytes]:
        """The non-zero pages of [start, end) (zero pages stay holes of the memfd)."""
        out = {}
        step = 1 << 20
        zero = bytes(PAGE)
        for chunk in range(start, end, step):
            data = self.tracee.mem.read(chunk, min(step, end - chunk))
            for off in range(0, len(data), PAGE):
                page = data[off:off + PAGE]
                if page != zero:
                    out[chunk + off] = page
        return out

    def _add_origins(self, start: int, end: int, origins: list[Origin]) -> None:
        self._cut_origins(start, end)
        self.origins += [o.clipped(start, end) for o in origins if o.start < end and start < o.end]
        self.origins.sort(key=lambda o: o.start)

    def _cut_origins(self, start: int, end: int) -> None:
        kept = []
        for o in self.origins:
            if o.end <= start or o.start >= end:
                kept.append(o)
                continue
            if o.start < start:
                kept.append(o.clipped(o.start, start))
            if o.end > end:
                kept.append(o.clipped(end, o.end))
        self.origins = sorted(kept, key=lambda o: o.start)

    def extend(self, rs: RemoteSyscalls, old_end: int, new_end: int, mappings) -> bool:
        """The aliased range ending at ``old_end`` grew to ``new_end`` (brk): the new
        pages (zeros) join it.  False if they cannot (they keep their memory)."""
        if not self.active or not self.spans.covers(old_end - PAGE, old_end) or \
                not self._image_free(old_end, new_end, mappings):
            return False
        rs.call("mremap", (old_end - PAGE) ^ ALIAS_BIT, PAGE, new_end - old_end + PAGE, 0)
        rs.call("mremap", old_end ^ ALIAS_BIT, 0, new_end - old_end,
                MREMAP_MAYMOVE | MREMAP_FIXED, old_end)
        # that duplicate took the image's MADV_DONTFORK: a fork child would lack the pages
        rs.call("madvise", old_end, new_end - old_end, MADV_DOFORK)
        origin = next((o for o in self.origins if o.start < old_end <= o.end), None)
        self.spans.add(old_end, new_end)
        self._add_origins(old_end, new_end, [Origin(old_end, new_end, origin.path if origin and
                                                    not origin.is_file else "")])
        return True

    def unmapped(self, rs: RemoteSyscalls, start: int, end: int) -> list[tuple[int, int]]:
        """The program unmapped [start, end) (munmap, brk shrink, MAP_FIXED over it):
        the alias of its aliased parts goes too, their memory is freed.  Returns
        those parts."""
        parts = self.spans.overlapping(start, page_up(end))
        for lo, hi in parts:
            self.set_bits(lo, hi, False)
            rs.call("madvise", lo ^ ALIAS_BIT, hi - lo, MADV_REMOVE, check=False)
            rs.call("munmap", lo ^ ALIAS_BIT, hi - lo, check=False)
            self.spans.remove(lo, hi)
            self._cut_origins(lo, hi)
        return parts

    def moved(self, rs: RemoteSyscalls, old: int, old_size: int, new: int, new_size: int,
              mappings) -> bool:
        """The program's mremap moved or resized an aliased range: the alias follows
        (same pages), or, if its new image is taken, the range loses its alias
        (False; its pages keep their memory, reached by the fault path)."""
        if not self.spans.covers(old, old + old_size):
            self.unmapped(rs, old, old + old_size)
            return False
        origins = [o for o in self.origins if o.start < old + old_size and old < o.end]
        self.set_bits(old, old + old_size, False)
        if new_size < old_size:
            rs.call("madvise", (old + new_size) ^ ALIAS_BIT, old_size - new_size, MADV_REMOVE,
                    check=False)
        self.spans.remove(old, old + old_size)
        self._cut_origins(old, old + old_size)
        others = [m for m in mappings if not (m.start <= (old ^ ALIAS_BIT) < m.end)]
        if not self._image_free(new, new + new_size, others):
            rs.call("munmap", old ^ ALIAS_BIT, old_size, check=False)
            self.refused["alias address taken"] += 1
            return False
        if new == old:      # resized in place: the alias too (its image is free)
            rs.call("mremap", old ^ ALIAS_BIT, old_size, new_size, 0)
        else:
            rs.call("mremap", old ^ ALIAS_BIT, old_size, new_size,
                    MREMAP_MAYMOVE | MREMAP_FIXED, new ^ ALIAS_BIT)
        self.spans.add(new, new + new_size)
        path = origins[0].path if origins and not origins[0].is_file else ""
        self._add_origins(new, new + new_size, [Origin(new, new + new_size, path)])
        return True

    def zero(self, rs: RemoteSyscalls, start: int, length: int) -> None:
        """MADV_DONTNEED / MADV_FREE of the program: private memory reads zeros
        afterwards, shared memory would not."""
        for lo, hi in self.spans.overlapping(start & ~(PAGE - 1), page_up(start + length)):
            rs.call("madvise", lo ^ ALIAS_BIT, hi - lo, MADV_REMOVE, check=False)

    def gone(self, maps: list[Mapping]) -> list[tuple[int, int]]:
        """The aliased parts where the alias no longer is in ``maps``: a thread
        stopped inside munmap (or mmap MAP_FIXED, mremap) when the tracer leaves
        changed the address space before its exit stop was seen."""
        own = [m for m in maps if NAME.decode() in m.path]
        out = []
        for start, end in self.spans:
            out += unmapped_parts(start, end, own)
        return out

    # ------------------------------------------- the program's own memory back
    def privatize(self, rs: RemoteSyscalls, protections: dict[int, int]) -> None:
        """In the process ``rs`` runs in (the target at detach, or a fork child
        before it runs): every aliased range becomes the private memory the
        program had mapped there (its file, or anonymous), holding what it holds
        now, with the program's own protections; the bitmap reads zeros (every
        probe accesses addresses themselves).  The alias itself is unmapped in
        the target (a fork child never had it)."""
        tracee = rs.tracee
        rs.mmap(self.bitmap.address, BITMAP_BYTES, PROT_READ,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE)
        child = tracee is not self.tracee
        if not child:
            # the zeros are the bitmap now: they go with the copies that read them
            # (target/mappings.py tells an anonymous area by its address)
            self.bitmap.anonymous = True
        for start, end in self.spans:
            pages = self._contents_of(tracee, start, end)
            for o in [o for o in self.origins if o.start < end and start < o.end] or \
                    [Origin(start, end)]:
                o = o.clipped(start, end)
                self._map_private(rs, o)
            for address, data in pages.items():
                tracee.mem.write(address, data)
            for page in range(start, end, PAGE):
                prot = protections.get(page)
                if prot is not None and prot != PROT_READ | PROT_WRITE:
                    rs.mprotect(page, PAGE, prot)
            if not child:
                rs.call("munmap", start ^ ALIAS_BIT, end - start, check=False)

    def _contents_of(self, tracee, start: int, end: int) -> dict[int, bytes]:
        saved, self.tracee = self.tracee, tracee
        try:
            return self._contents(start, end)
        finally:
            self.tracee = saved

    def _map_private(self, rs: RemoteSyscalls, o: Origin) -> None:
        flags = MAP_PRIVATE | MAP_FIXED
        prot = PROT_READ | PROT_WRITE
        if o.is_file and os.path.exists(o.path):
            scratch = (rs.saved_regs.rsp - 8192) & ~15
            rs.tracee.mem.write(scratch, o.path.encode() + b"\0")
            fd = rs.call("openat", -100, scratch, O_RDONLY, check=False)
            if fd < 1 << 63:
                try:
                    rs.mmap(o.start, o.end - o.start, prot, flags, fd, o.offset)
                    return
                finally:
                    rs.call("close", fd, check=False)
        rs.mmap(o.start, o.end - o.start, prot, flags | MAP_ANONYMOUS)

    def forget(self) -> None:
        """exec: the address space is gone, and the aliases with it."""
        self.spans = Spans()
        self.origins = []
        self.active = False

    # --------------------------------------------------------- maps view
    def maps_view(self, text: str) -> str:
        """/proc/PID/maps as the program would see it: aliased ranges under their
        own names, their images left out."""
        if not len(self.spans):
            return text
        out = []
        for m in parse_maps(text):
            if m.path.startswith("/memfd:" + NAME.decode()):
                if self.spans.overlapping(m.start, m.end):
                    for o in self.origins:
                        if o.start < m.end and m.start < o.end:
                            o = o.clipped(m.start, m.end)
                            out.append(Mapping(o.start, o.end, m.perms[:3] + "p", o.offset, o.dev,
                                               o.inode, o.path))
                continue       # an image
            out.append(m)
        out.sort(key=lambda m: m.start)
        return "".join(f"{m.start:x}-{m.end:x} {m.perms} {m.offset:08x} {m.dev} {m.inode}"
                       f"{' ' * 10 + m.path if m.path else ''}\n" for m in out)
