# SPDX-License-Identifier: GPL-2.0-or-later
"""What an earlier session left in a process, found and taken out at attach.

A session killed with SIGKILL leaves the target running with madtrace's
patches, trampolines, rings and (with --data) its guard in place; the target
goes on correctly.  The next session on that process, before it installs
anything (every thread stopped), finds and removes all of it:

* areas: every mapping of a memfd named ``madtrace-*`` (areas.py).  No live
  session can own one (a process has one tracer, and that is us now) but for
  our own call page (process/call_page.py), mapped by our first remote call;
* recording off in the old rings (a control block is known by its magic), so
  that a thread still inside a trampoline leaves it without waiting;
* trampolines: each 16-byte boundary of an old code area is tried against
  every template (``Template.recognise``, the description that emits them): a
  call-site trampoline gives the return point of its re-issued call and the
  site's own return address, an exit stub its address (the calls pending
  there are on the old shadow stacks);
* patched sites: the executable mappings of every module within rel32 reach
  of an old code area are compared with the file they map; a run of bytes
  that differ and start with a ``jmp rel32`` into an old code area is a
  patch, and gets the file's bytes back;
* the guard of an old data area (layout.h "The guard"): what it would do if it
  ran now: each page's protection back, finished slots written back,
  breakpoints out, pending calls' return addresses, the target's own signal
  actions;
* unwind information still registered (state 2) is taken back from the
  unwinder (one being registered when the session died, state 1, may or may
  not be: that area stays);
then the areas are released as a session's own (mappings.py), and
``Found.line`` says in one line what was found and restored.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..arch.x86_64.encode import JMP_REL32
from ..binary.maps import read_maps
from ..errors import LeftoversError, MadtraceError
from ..process.remote_syscall import RemoteSyscalls
from .areas import MAPS_PREFIX, REL32_REACH, TargetArea
from .mappings import MadtraceAreas, Release
from .templates import Injector, load_injector
from .unwind_registry import Unwinder, objects

KNOWN_VERSIONS = (2, 3, 4)        # ring layouts whose LIMIT and flag offsets are the current layout's
TRAMPOLINES = ("callsite", "tailsite", "entry", "exitstub")
# code areas an entry may have been patched to jump into: function tracing's
# trampolines, the hybrid engine's function copies and hook stubs
CODE_AREAS = ("madtrace-code-", "madtrace-copies-", "madtrace-hooks-")
SIGSEGV, SIGTRAP = 11, 5


@dataclass
class Found:
    """What an earlier session left, and what became of it."""
    areas: int = 0
    sites: list[tuple[int, str]] = field(default_factory=list)     # (address, where)
    guard: str = ""
    aliases: str = ""        # a hybrid session's aliased memory, made the program's again
    release: Release = field(default_factory=Release)
    held: list[tuple[str, int, str]] = field(default_factory=list)   # kept before release

    def __bool__(self) -> bool:
        return bool(self.areas or self.sites or self.guard)

    def line(self, pid: int) -> str:
        where = sorted({w for _, w in self.sites})
        out = (f"process {pid} still had what an earlier madtrace session left: "
               f"{len(self.sites)} patched site{'s' if len(self.sites) != 1 else ''}")
        if self.sites:
            out += f" (in {', '.join(where[:3])}{'...' if len(where) > 3 else ''}) " \
                   f"restored from the file{'s' if len(where) > 1 else ''}"
        release = self.release
        unmapped = sum(n for _, n in release.unmapped)
        out += f", {len(release.unmapped)} of its {self.areas} mappings " \
               f"({unmapped / 1048576:.1f} MiB) unmapped"
        if release.returns:
            out += f", {release.returns} pending calls given their return address"
        if self.guard:
            out += f", {self.guard}"
        if self.aliases:
            out += f", {self.aliases}"
        kept = self.held + release.kept
        if kept:
            out += f"; {len(kept)} left mapped: {kept[0][2]}"
        return out


HYBRID_GROUP = "orphan-session"      # a hybrid session's areas stay or go together


def orphan_areas(maps) -> list[TargetArea]:
    """madtrace's memfd mappings (adjacent lines of one memfd are one area)."""
    areas: list[TargetArea] = []
    for m in maps:
        if not m.path.startswith(MAPS_PREFIX):
            continue
        name = m.file_path[len("/memfd:"):]
        last = areas[-1] if areas else None
        if last is not None and last.end == m.start and last.inode == m.inode:
            last.size += m.size
            last.executable |= "x" in m.perms
            continue
        area = TargetArea(name, m.start, m.size, "x" in m.perms, group=_group(name))
        area.inode = m.inode
        area.returns_known = False      # what the earlier session knew went with it
        areas.append(area)
    if any(a.name == "madtrace-alias" for a in areas):
        # copies read the bitmap and write the rings, hook stubs the traced pages
        for area in areas:
            if area.name != "madtrace-calls":
                area.group = HYBRID_GROUP
    return areas


def _group(name: str) -> str:
    if name.startswith(("madtrace-code-", "madtrace-rings", "madtrace-unwind")):
        return "orphan-functions"
    return "orphan-" + name


def recover(tracee, space, aliases=None) -> Found:
    """Find and remove what an earlier session left (every thread stopped).
    ``aliases(tracee, space, areas, runs, data, injector) -> str``: takes a
    hybrid session's aliases out (data/hybrid/alias_leftovers.py); without it such
    leftovers are refused."""
    found = Found()
    maps = read_maps(tracee.pid)
    ours = tracee.call_page.address if tracee.call_page is not None else None
    areas = [a for a in orphan_areas(maps) if a.address != ours]     # this session's
    for area in areas:
        # a thread the killed tracer had lent may still be in its restore code:
        # straight code, run on to the thread's own rip (process/call_page.py)
        area.steppable |= area.name == "madtrace-calls"
    if not areas:
        return found
    if any(a.name == "madtrace-alias" for a in areas) and aliases is None:
        # the program's own traced memory is a shared memfd now, mapped twice, and
        # functions run in copies that read the alias bitmap; nothing is changed
        raise LeftoversError(f"process {tracee.pid} still runs on a killed madtrace session's "
                             "hybrid data engine (its traced memory aliased): this session "
                             "cannot take it out; the process runs on as it is")
    found.areas = len(areas)
    L = load_injector()
    rings = _recording_off(tracee.mem, areas, L)
    exit_stubs: set[int] = set()
    for area in areas:
        if area.name.startswith("madtrace-code-"):
            exit_stubs |= _recognise(tracee.mem, area, L)
    # entries patched to jump into trampolines, function copies or hook stubs
    code = [a for a in areas if a.executable and a.name.startswith(CODE_AREAS)]
    found.sites = _restore_sites(tracee, maps, code, space)
    data = next((a for a in areas if a.name == "madtrace-data"), None)
    runs: list = []
    if data is not None:
        found.guard, runs = _undo_guard(tracee, data, L)
    if aliases is not None:
        found.aliases = aliases(tracee, space, areas, runs, data, L)
    for area in [a for a in areas if a.name == "madtrace-unwind"]:
        why = _unwind(tracee, area, L, space)
        if why:
            areas.remove(area)
            found.held.append((area.name, area.size, why))
    areas_of_old = MadtraceAreas()
    areas_of_old.areas = areas
    areas_of_old.return_sources.append(lambda: _shadow_returns(tracee.mem, rings, exit_stubs, L))
    found.release = areas_of_old.release(tracee)
    return found


def _recording_off(mem, areas, L: Injector) -> list[int]:
    """Recording off in every old control block (writers never wait); returns
    the addresses of the ring blocks its slot table names."""
    rings: list[int] = []
    for area in areas:
        if not area.name.startswith("madtrace-rings"):
            continue
        try:
            magic, version = struct.unpack("<QQ", mem.read(area.address, 16))
        except MadtraceError:
            continue
        if magic != L.MT_MAGIC or version not in KNOWN_VERSIONS:
            continue
        flags = mem.read(area.address + L.MT_CTL_FLAGS, 1)[0]
        mem.write(area.address + L.MT_CTL_FLAGS, bytes([flags & ~L.MT_FLAG_ENABLED & 0xFF]))
        mem.write(area.address + L.MT_CTL_NOWAIT, b"\x01")
        table = np.frombuffer(mem.read(area.address + L.MT_SLOT_TABLE, L.MT_SLOT_TABLE_SIZE),
                              dtype="<u8").reshape(-1, 2)
        for key, ring in table.tolist():
            if key > 1 and any(a.contains(ring) for a in areas):
                mem.write_u64(ring + L.MT_RING_LIMIT, 0)
                rings.append(ring)
    return rings


def _recognise(mem, area: TargetArea, L: Injector) -> set[int]:
    """The trampolines of an old code area: their return points go into
    ``area.return_points``; returns the addresses of its exit stubs."""
    templates = [t for name, t in L.templates.items() if name.rsplit("_", 1)[0] in TRAMPOLINES]
    code = mem.read(area.address, area.size)
    exit_stubs: set[int] = set()
    recognised = 0
    for offset in range(0, len(code), 16):
        first = code[offset]
        for template in templates:
            if template.code[0] != first:
                continue
            address = area.address + offset
            fields = template.recognise(code[offset:offset + template.size], address)
            if fields is None:
                continue
            recognised += 1
            kind = template.name.rsplit("_", 1)[0]
            if kind == "callsite":
                (call_field, _), = template.patch_points["target"]
                area.return_points[address + call_field + 4] = fields["return"]
            elif kind == "exitstub":
                exit_stubs.add(address)
            break
    area.steppable = recognised > 0
    return exit_stubs


def _restore_sites(tracee, maps, code: list[TargetArea], space) -> list[tuple[int, str]]:
    """Every patch into an old code area gets the bytes of the file back."""
    if not code:
        return []
    sites: list[tuple[int, str]] = []
    for m in maps:
        if "x" not in m.perms or not m.file_path.startswith("/") or \
                not any(m.end > a.address - REL32_REACH and m.start < a.end + REL32_REACH
                        for a in code):
            continue
        original = _file_bytes(tracee.pid, m)
        if not original:
            continue
        try:
            current = tracee.mem.read(m.start, len(original))
        except MadtraceError:
            continue
        now = np.frombuffer(current, dtype=np.uint8)
        differ = np.nonzero(now != np.frombuffer(original, dtype=np.uint8))[0]
        for lo, hi in _runs(differ):
            site = _patch_at(current, lo, m.start, code)
            if site is None:
                continue
            end = min(max(hi, site + 5), len(original))
            tracee.mem.write(m.start + site, original[site:end])
            module = space.module_for(m.start + site) if space is not None else None
            sites.append((m.start + site, module.name if module else os.path.basename(m.file_path)))
    return sites


def _file_bytes(pid: int, m) -> bytes:
    """What the file holds for an executable mapping (the mapped file itself,
    through map_files, when the path was replaced meanwhile)."""
    for path in (f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}", m.file_path):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            return os.pread(fd, m.size, m.offset)
        except OSError:
            continue
        finally:
            os.close(fd)
    return b""


def _runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """Runs of differing bytes [lo, hi); differences less than 5 bytes apart are
    one run (a rel32 may keep some bytes of the original)."""
    if len(indices) == 0:
        return []
    breaks = np.nonzero(np.diff(indices) >= 5)[0]
    starts = np.concatenate(([indices[0]], indices[breaks + 1]))
    ends = np.concatenate((indices[breaks], [indices[-1]])) + 1
    return list(zip(starts.tolist(), ends.tolist()))


def _patch_at(current: bytes, lo: int, base: int, code: list[TargetArea]) -> int | None:
    """The offset of a ``jmp rel32`` into an old code area whose 5 bytes cover
    the first difference at ``lo`` (a patched tail call keeps its opcode)."""
    for site in range(max(lo - 4, 0), lo + 1):
        if current[site] != JMP_REL32 or site + 5 > len(current):
            continue
        target = base + site + 5 + struct.unpack_from("<i", current, site + 1)[0]
        if any(a.contains(target) for a in code):
            return site
    return None


def _shadow_returns(mem, rings: list[int], exit_stubs: set[int], L: Injector) -> list:
    """(slot, exit stubs, real return) of the calls pending on the old shadow stacks."""
    pending = []
    for ring in rings:
        try:
            top = min(mem.read_u64(ring + L.MT_RING_SHADOW_TOP), L.MT_SHADOW_ENTRIES)
            entries = np.frombuffer(mem.read(ring + L.MT_RING_SHADOW, 16 * top),
                                    dtype="<u8").reshape(-1, 2)
        except MadtraceError:
            continue
        newer = 0
        for ret, slot in entries[::-1].tolist():
            if slot > newer:
                pending.append((slot, exit_stubs, ret))
                newer = slot
    return pending


def _undo_guard(tracee, area: TargetArea, L: Injector) -> tuple[str, list[tuple[int, int]]]:
    """What the old guard would do if it ran now, done from here (every field of
    layout.h "The guard" is an offset in its table, MT_GUARD into the area).
    Returns what it did, and the (start, end) of the runs it had protected."""
    mem = tracee.mem
    table = area.address + L.MT_GUARD
    active, nruns, _fired, trap_active = struct.unpack("<QQQQ", mem.read(table, 32))
    nbreaks = min(mem.read_u64(table + L.MT_GUARD_NBREAKS), L.MT_GUARD_MAX_BREAKS)
    ntraps = min(mem.read_u64(table + L.MT_GUARD_NTRAPS), L.MT_GUARD_MAX_TRAPS)
    nruns = min(nruns, L.MT_GUARD_MAX_RUNS)
    if not (active or trap_active or nruns or nbreaks or ntraps):
        return "", []
    runs = np.frombuffer(mem.read(table + L.MT_GUARD_RUNS, nruns * L.MT_GUARD_RUN_SIZE),
                         dtype="<u8").reshape(-1, 3).tolist()
    maps = read_maps(tracee.pid)
    with RemoteSyscalls(tracee) as rs:
        for start, length, prot in runs:
            # what of the run is still mapped (the program may have unmapped some since)
            for m in maps:
                lo, hi = max(m.start, start), min(m.end, start + length)
                if lo < hi:
                    rs.mprotect(lo, hi - lo, prot)
        for slot in range(L.MT_DATA_SLOTS):
            base = area.address + slot * L.MT_DSLOT_SIZE
            address, length, done = struct.unpack("<QQQ", mem.read(base + L.MT_DSLOT_ADDR, 24))
            length = min(length, L.MT_DSLOT_BYTES_MAX)
            if address and done and length:
                data = mem.read(base + L.MT_DSLOT_BYTES, length)
                if data != mem.read(base + L.MT_DSLOT_ORIGINAL, length):
                    mem.write(address, data)
            mem.write_u64(base + L.MT_DSLOT_ADDR, 0)
        breaks = table + L.MT_GUARD_BREAKS
        for i in range(nbreaks):
            address, byte, _prot = struct.unpack("<QQQ", mem.read(breaks + i * L.MT_GUARD_BREAK_SIZE, 24))
            if mem.read(address, 1) == b"\xcc":
                mem.write(address, bytes([byte & 0xFF]))
        traps = table + L.MT_GUARD_TRAPS
        for i in range(ntraps):
            trap, ret, slot = struct.unpack("<QQQ", mem.read(traps + i * L.MT_GUARD_TRAP_SIZE, 24))
            if trap and mem.read_u64(slot) == trap:
                mem.write_u64(slot, ret)
        if trap_active:
            rs.call("rt_sigaction", SIGTRAP, table + L.MT_GUARD_TRAP_ACTION, 0, 8)
        if active:
            rs.call("rt_sigaction", SIGSEGV, table + L.MT_GUARD_ACTION, 0, 8)
    mem.write(table, struct.pack("<QQQQ", 0, 0, 1, 0))
    mem.write_u64(table + L.MT_GUARD_NBREAKS, 0)
    mem.write_u64(table + L.MT_GUARD_NTRAPS, 0)
    return (f"its data guard undone ({len(runs)} protected runs, {nbreaks} breakpoints, "
            f"signal actions back)"), [(start, start + length) for start, length, _ in runs]


def _unwind(tracee, area: TargetArea, L: Injector, space) -> str:
    """Prepares an old unwind area to go (each of its objects still registered is
    taken back from the unwinder first); returns why it must stay ('' if not)."""
    offsets = objects(tracee.mem.read_u64, area.address, L)
    states = {o: tracee.mem.read_u64(area.address + o + L.MT_UNWIND_STATE) for o in offsets}
    if any(state not in (0, 2) for state in states.values()):
        return f"{area.name} may or may not be registered with the unwinder (it was being registered)"
    registered = [o for o, state in states.items() if state == 2]
    if not registered:
        return ""
    try:
        deregister = Unwinder(space).deregistrar()
    except MadtraceError:
        return f"{area.name} is registered with an unwinder madtrace cannot find"
    for offset in registered:
        area.before_unmap.append(lambda rs, at=area.address + offset + L.MT_UNWIND_FRAMES:
                                 rs.call_function(deregister, at))
    return ""
