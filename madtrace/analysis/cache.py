# SPDX-License-Identifier: GPL-2.0-or-later
"""A cache hierarchy simulated over a trace's data accesses (madtrace report
DIR --kind cache [--cache SPEC]), with its misses per data (variable and
field, heap block, region), per function, per call and per source line.

The model (memory_sim.c): set-associative levels, LRU, write-back,
write-allocate; a miss fills the line from the next level, then evicts the
least recently used line of its set, a dirty one written to the next level.
An access that spans two lines is a lookup of each.  The first levels are
each thread's own, the last one is shared (the machine's: as
/sys/devices/system/cpu/cpu0/cache says which CPUs share each level; a SPEC:
every level but the last is private).  Threads' accesses are interleaved as
access_stream.py says; a store takes the line out of the other threads'
private levels (``invalidations``), so their next use of it misses.

A level's ``misses`` count every lookup that missed: the accesses' own
(``load_misses``, ``store_misses``: by the kind of the access that led
there) and those of lines written back from the level above
(``writeback_misses``).  The misses per data, function, call and line are
the accesses' own.  Block events (memcpy, read()...) are not simulated.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError
from ..trace.access_pass import Tally
from ..trace.read_ahead import read_ahead
from .access_counters import cache_misses
from .access_stream import AccessStream, StreamChunk
from .memory_sim import CacheHierarchy
from .shared_pass import Part, SharedPass, run_parts, trace_threads
from .source_lines import place_instructions
from .trace_input import require_accesses

SYS_CACHE = "/sys/devices/system/cpu/cpu0/cache"
SPEC_HELP = "LEVEL=SIZE:WAYS:LINE,... e.g. L1=32K:8:64,L2=1M:16:64,L3=32M:16:64"
MAX_LEVELS = 4
_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 1 << 30,
    "GIB": 1 << 30,
}


@dataclass(frozen=True)
class Level:
    name: str
    size: int
    ways: int
    line: int
    shared: bool = False  # one for all threads (else each thread has its own)

    def text(self) -> str:
        return f"{self.name}={_size_text(self.size)}:{self.ways}:{self.line}"


def _size_text(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _size(text: str, what: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise UsageError(f"--cache: {what}: {text!r} is not a size (32K, 1M, 65536)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_spec(spec: str) -> list[Level]:
    """``L1=32K:8:64,L2=1M:16:64``: every level but the last private."""
    levels = []
    for part in [p for p in spec.split(",") if p.strip()]:
        name, eq, rest = part.partition("=")
        fields = rest.split(":")
        if not eq or not name.strip() or len(fields) != 3:
            raise UsageError(f"--cache: {part!r} is not LEVEL=SIZE:WAYS:LINE ({SPEC_HELP})")
        size = _size(fields[0], name)
        ways, line = (_size(f, name) for f in fields[1:])
        levels.append(Level(name.strip(), size, ways, line))
    _check(levels, "--cache")
    return [
        Level(lv.name, lv.size, lv.ways, lv.line, shared=(i == len(levels) - 1 and i > 0))
        for i, lv in enumerate(levels)
    ]


def _check(levels: list[Level], where: str) -> None:
    if not levels:
        raise UsageError(f"{where}: no cache level ({SPEC_HELP})")
    if len(levels) > MAX_LEVELS:
        raise UsageError(f"{where}: at most {MAX_LEVELS} levels")
    if len({lv.name for lv in levels}) != len(levels):
        raise UsageError(f"{where}: a level is named twice")
    for lv in levels:
        if lv.line < 8 or lv.line & (lv.line - 1):
            raise UsageError(f"{where}: {lv.name}: the line ({lv.line}) must be a power of two >= 8")
        if lv.ways < 1 or lv.size % (lv.ways * lv.line):
            raise UsageError(
                f"{where}: {lv.name}: the size ({lv.size}) must be a multiple of "
                f"ways x line ({lv.ways} x {lv.line})"
            )
    if len({lv.line for lv in levels}) != 1:
        raise UsageError(f"{where}: every level must have the same line size")


def machine_levels(root: str = SYS_CACHE) -> list[Level]:
    """The data and unified caches of CPU 0, from sysfs: shared when another
    CPU than CPU 0's own core shares it."""
    if not os.path.isdir(root):
        raise UsageError(f"{root} does not say this machine's caches: pass --cache {SPEC_HELP}")
    levels = []
    try:
        for entry in sorted(os.listdir(root)):
            if not entry.startswith("index"):
                continue
            d = os.path.join(root, entry)

            def read(name: str, d: str = d) -> str:
                with open(os.path.join(d, name)) as f:
                    return f.read().strip()

            if read("type") == "Instruction":
                continue
            cpus = _cpu_count(read("shared_cpu_list"))
            levels.append(
                (
                    int(read("level")),
                    Level(
                        f"L{read('level')}",
                        _size(read("size"), entry),
                        int(read("ways_of_associativity")),
                        int(read("coherency_line_size")),
                        shared=cpus > _core_threads(),
                    ),
                )
            )
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{root} does not say this machine's caches ({exc}): pass --cache {SPEC_HELP}"
        ) from None
    out = [lv for _, lv in sorted(levels, key=lambda x: x[0])]
    _check(out, root)
    # a shared level above a private one is not modelled: from the first shared, all are
    first_shared = next((i for i, lv in enumerate(out) if lv.shared), len(out))
    return [Level(lv.name, lv.size, lv.ways, lv.line, shared=i >= first_shared) for i, lv in enumerate(out)]


def _cpu_count(cpu_list: str) -> int:
    n = 0
    for part in cpu_list.split(","):
        lo, _, hi = part.partition("-")
        n += (int(hi) - int(lo) + 1) if hi else 1
    return n


def _core_threads() -> int:
    try:
        with open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") as f:
            return _cpu_count(f.read().strip())
    except (OSError, ValueError):
        return 1


# ------------------------------------------------------------------ result
@dataclass
class CacheReport:
    directory: str
    levels: list[Level]
    level_stats: list[dict[str, int]]
    accesses: int
    threads: int
    spec_from: str  # "machine" or "--cache"
    interleaving: str = "exact"  # access_stream.AccessStream.interleaving
    by_data: list[dict] = field(default_factory=list)
    by_site: list[dict] = field(default_factory=list)  # heap blocks per allocation site
    by_function: list[dict] = field(default_factory=list)
    by_call: list[dict] = field(default_factory=list)
    by_line: list[dict] = field(default_factory=list)

    def spec(self) -> str:
        return ",".join(lv.text() for lv in self.levels)

    def to_dict(self) -> dict:
        levels = []
        for lv, st in zip(self.levels, self.level_stats):
            levels.append(
                {
                    "name": lv.name,
                    "size": lv.size,
                    "ways": lv.ways,
                    "line": lv.line,
                    "shared": lv.shared,
                    "accesses": st["loads"] + st["stores"] + st["writebacks_in"],
                    "misses": st["load_misses"] + st["store_misses"] + st["writeback_misses"],
                    "load_misses": st["load_misses"],
                    "store_misses": st["store_misses"],
                    "writeback_misses": st["writeback_misses"],
                    "writebacks": st["writebacks"],
                    "invalidations": st["invalidations"],
                    "loads": st["loads"],
                    "stores": st["stores"],
                    "writebacks_in": st["writebacks_in"],
                }
            )
        return {
            "kind": "cache",
            "directory": self.directory,
            "spec": self.spec(),
            "spec_from": self.spec_from,
            "accesses": self.accesses,
            "threads": self.threads,
            "interleaving": self.interleaving,
            "levels": levels,
            "by_data": self.by_data,
            "by_site": self.by_site,
            "by_function": self.by_function,
            "by_call": self.by_call,
            "by_line": self.by_line,
        }


class CachePart(Part):
    """The cache simulation as a part of the shared pass (of one thread: the
    simulation needs every thread's accesses in one order, cache_report
    merges them): memory_sim.c simulates, access_counters.c tallies the
    misses per data and function, instruction and call."""

    label = "cache"
    names = True

    def __init__(self, directory: str, spec: str | None = None, top_calls: int = 1000):
        self.levels = parse_spec(spec) if spec else machine_levels()
        require_accesses(directory, "cache")
        self.directory, self.spec, self.top_calls = directory, spec, top_calls
        width = 1 + len(self.levels)
        self.by_data_fn, self.by_rip, self.by_call = Tally(width), Tally(width), Tally(width)
        self.accesses = 0
        self.sim: CacheHierarchy | None = None
        self.stream: AccessStream | None = None

    def prepare(self, shared: SharedPass) -> None:
        self.start(shared.stream, len(shared.tids))

    def start(self, stream: AccessStream | None, threads: int) -> None:
        """Before the accesses of ``threads`` threads, read from ``stream``."""
        levels = self.levels
        private = next((i for i, lv in enumerate(levels) if lv.shared), len(levels))
        self.stream = stream
        self.sim = CacheHierarchy(
            [(lv.size, lv.ways) for lv in levels], levels[0].line, private, coherent=threads > 1
        )

    def add(self, tid: int, chunk: StreamChunk) -> None:
        assert self.sim is not None and self.stream is not None  # start() came first
        c = chunk.columns
        codes = self.sim.run(c["addr"], c["size"], c["kind"], chunk.thread)
        by_call = self.by_call if self.stream.has_calls else None
        cache_misses(self.by_data_fn, self.by_rip, by_call, len(self.levels), c, codes)
        self.accesses += len(codes)

    def result(self) -> CacheReport:
        stream, sim, levels = self.stream, self.sim, self.levels
        assert stream is not None and sim is not None
        names = [lv.name for lv in levels]
        width = 1 + len(levels)
        labels, regions, sites_of = stream.data_labels()
        report = CacheReport(
            self.directory,
            levels,
            sim.stats(),
            self.accesses,
            len(stream.tids),
            "--cache" if self.spec else "machine",
            stream.interleaving,
        )
        keys, sums, _ = self.by_data_fn.result()
        data: dict[str, list] = {}
        sites: dict[str, np.ndarray] = {}
        functions: dict[str, np.ndarray] = {}
        for key, row in zip(keys.tolist(), sums):
            did, fid = key >> 32, (key & 0xFFFFFFFF) - 1
            entry = data.setdefault(labels[did], [regions[did], np.zeros(width, np.int64)])
            entry[1] += row
            site = sites_of[did]
            if site is not None:
                sites[site] = sites.get(site, np.zeros(width, np.int64)) + row
            fname = stream.function_name(fid)
            functions[fname] = functions.get(fname, np.zeros(width, np.int64)) + row
        report.by_data = _rows(
            "data", {k: v[1] for k, v in data.items()}, names, {k: {"region": v[0]} for k, v in data.items()}
        )
        report.by_site = _rows("site", sites, names)
        if stream.has_calls:
            report.by_function = _rows("function", functions, names)
            report.by_call = _calls(stream, self.by_call, names, self.top_calls)
        report.by_line = _lines(self.directory, self.by_rip, names)
        return report

    def close(self) -> None:
        if self.sim is not None:
            self.sim.close()
        for t in (self.by_data_fn, self.by_rip, self.by_call):
            t.close()


def cache_report(directory: str, spec: str | None = None, top_calls: int = 1000) -> CacheReport:
    part = CachePart(directory, spec, top_calls)
    if len(trace_threads(directory)) < 2:
        return run_parts(directory, [part])[0]
    stream = AccessStream(directory, "cache")  # every thread's accesses merged in one order
    try:
        part.start(stream, len(stream.tids))
        for chunk in read_ahead(stream.merged()):
            part.add(-1, chunk)
        return part.result()
    finally:
        part.close()
        stream.close()


def cache_part(directory: str, spec: str | None = None) -> CachePart | None:
    """The cache's part of a shared pass: of a trace of one thread only."""
    if len(trace_threads(directory)) > 1:
        return None
    return CachePart(directory, spec)


def _entry(sums, names: list[str]) -> dict:
    return {"accesses": int(sums[0]), "misses": {n: int(m) for n, m in zip(names, sums[1:])}}


def _rank(item) -> tuple:
    return tuple(-v for v in reversed(item[1][1:].tolist())) + (-int(item[1][0]), str(item[0]))


def _rows(label: str, table: dict, names: list[str], extra: dict | None = None) -> list[dict]:
    """Rows most missed first: at the last level, then the one above..."""
    return [
        {label: key, **(extra or {}).get(key, {}), **_entry(sums, names)}
        for key, sums in sorted(table.items(), key=_rank)
    ]


def _calls(stream: AccessStream, tally: Tally, names: list[str], top: int) -> list[dict]:
    keys, sums, _ = tally.result()
    keep = [i for i in range(len(keys)) if keys[i] != 0]  # 0: outside every call
    last = sums[:, -1] if len(sums) else np.zeros(0, np.int64)
    keep.sort(key=lambda i: (-int(last[i]), -int(sums[i, 0]), int(keys[i])))
    found = _call_functions(stream, {int(keys[i]) - 1 for i in keep[:top]})
    rows = []
    for i in keep[:top]:
        fid, tid = found.get(int(keys[i]) - 1, (-1, 0))
        rows.append(
            {
                "call_id": int(keys[i]) - 1,
                "function": stream.function_name(fid),
                "tid": tid,
                **_entry(sums[i], names),
            }
        )
    return rows


def _call_functions(stream: AccessStream, calls: set[int]) -> dict[int, tuple[int, int]]:
    """The function and thread of each call id of ``calls`` (the segmentation,
    call records only)."""
    from ..trace.segmentation import iter_thread_chunks

    out: dict[int, tuple[int, int]] = {}
    if not calls:
        return out
    wanted = np.fromiter(calls, dtype=np.int64)
    for chunk in iter_thread_chunks(stream.directory, tables=stream.tables, accesses=False):
        segments = chunk.segments
        if not len(segments):
            continue
        ids = segments["call_id"].astype(np.int64)
        hit = np.isin(ids, wanted)
        for cid, fid in zip(ids[hit].tolist(), segments["fid"][hit].tolist()):
            out[cid] = (fid, chunk.tid)
    return out


def _lines(directory: str, tally: Tally, names: list[str]) -> list[dict]:
    keys, sums, _ = tally.result()
    placed = place_instructions(directory, keys.tolist())
    lines: dict[tuple, np.ndarray] = {}
    for key, row in zip(keys.tolist(), sums):
        path, line = placed[key]
        where = (path, line) if path is not None else (None, line)
        lines[where] = lines.get(where, 0) + row
    out = []
    for (path, line), row in sorted(lines.items(), key=lambda kv: _rank((str(kv[0]), kv[1]))):
        place = {"file": path, "line": line} if path is not None else {"file": None, "function": line}
        out.append({**place, **_entry(row, names)})
    return out
