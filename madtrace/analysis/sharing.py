# SPDX-License-Identifier: GPL-2.0-or-later
"""Cache lines shared by threads (madtrace report DIR --kind sharing [--line N]).

Every cache line stored to by one thread and touched by another is listed:
``false`` sharing when the bytes each thread touched are disjoint from those
the others stored (the threads only share the line: padding them apart
removes the traffic), ``true`` when they overlap (the threads share the
data).  Per thread: its loads, stores, the bytes it touched, the data it
touched there (variable and field, heap block) and the functions that did.
``transfers``: the times the line would move between the threads' caches, as
a coherent cache (MSI) keeps it: a store by a thread that is not its only
holder, a load of a line another thread holds modified.  Lines are ranked
by transfers.

Two passes over the accesses: the first (memory_sim.c) follows every line's
holders, in the order of access_stream.py; the second gathers, for the
shared lines only, who touched which bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import UsageError
from ..trace.access_pass import Tally
from ..trace.read_ahead import read_ahead
from .access_stream import AccessStream
from .memory_sim import LineSharing

DEFAULT_LINE = 64
MAX_LINE = 4096


def check_line(line: int | None) -> int:
    line = DEFAULT_LINE if line is None else line
    if line < 8 or line > MAX_LINE or line & (line - 1):
        raise UsageError(f"--line must be a power of two from 8 to {MAX_LINE}, not {line}")
    return line


@dataclass
class _ThreadUse:
    loads: int = 0
    stores: int = 0
    touched: int = 0  # a bit per byte of the line
    stored: int = 0
    data: set = field(default_factory=set)
    functions: set = field(default_factory=set)


@dataclass
class SharingReport:
    directory: str
    line: int
    threads: list[int]
    interleaving: str = "exact"
    lines: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "kind": "sharing",
            "directory": self.directory,
            "line": self.line,
            "threads": self.threads,
            "interleaving": self.interleaving,
            "false": sum(r["kind"] == "false" for r in self.lines),
            "true": sum(r["kind"] == "true" for r in self.lines),
            "lines": self.lines,
        }


def _byte_ranges(mask: int) -> str:
    """ "0-7,16-23" of the bits set."""
    out, i = [], 0
    while mask >> i:
        if (mask >> i) & 1:
            j = i
            while (mask >> (j + 1)) & 1:
                j += 1
            out.append(f"{i}-{j}" if j > i else str(i))
            i = j + 1
        else:
            i += 1
    return ",".join(out)


def sharing_report(directory: str, line: int | None = None) -> SharingReport:
    line = check_line(line)
    shift = np.uint64(line.bit_length() - 1)
    stream = AccessStream(directory, "sharing")
    report = SharingReport(directory, line, list(stream.tids), stream.interleaving)
    try:
        if len(stream.tids) < 2:
            return report
        sharing = LineSharing(line)
        try:
            for chunk in read_ahead(stream.merged()):
                c = chunk.columns
                sharing.run(c["addr"], c["size"], c["kind"], chunk.thread)
            lines, transfers = sharing.shared()
        finally:
            sharing.close()
        if not len(lines):
            return report
        uses: dict[tuple[int, int], _ThreadUse] = {}
        gather: tuple[int, _Gather] | None = None
        try:
            for _tid, chunk in read_ahead(stream.threads()):
                thread = int(chunk.thread)
                if gather is None or gather[0] != thread:
                    if gather is not None:
                        gather[1].into(gather[0], uses)
                        gather[1].close()
                    gather = (thread, _Gather(lines, shift, line))
                gather[1].add(chunk.columns)
            if gather is not None:
                gather[1].into(gather[0], uses)
        finally:
            if gather is not None:
                gather[1].close()
        labels, _regions, _sites = stream.data_labels()
        report.lines = _lines(stream, labels, lines, transfers, uses, line)
        return report
    finally:
        stream.close()


class _Gather:
    """One thread's uses of the shared ``lines``, tallied in C: per (line, byte
    range, load or store) a count, per (line, data id) and (line, function) a
    presence; ``into`` adds them to ``uses``."""

    def __init__(self, lines: np.ndarray, shift: np.uint64, line: int):
        self.lines, self.shift, self.line = lines, shift, line
        self.bits = np.uint64(line.bit_length())  # lo and hi are 0..line
        self.ranges, self.data, self.functions = Tally(1), Tally(1), Tally(1)

    def close(self) -> None:
        for t in (self.ranges, self.data, self.functions):
            t.close()

    def add(self, c: dict) -> None:
        addr = c["addr"]
        size = np.maximum(c["size"].astype(np.uint64), np.uint64(1))
        first = addr >> self.shift
        last = (addr + size - np.uint64(1)) >> self.shift
        lines = self.lines
        for line_no, only in ((first, None), (last, last != first)):
            if only is not None and not only.any():
                break
            pos = np.searchsorted(lines, line_no)
            hit = (pos < len(lines)) & (lines[np.minimum(pos, len(lines) - 1)] == line_no)
            if only is not None:
                hit &= only
            idx = np.nonzero(hit)[0]
            if not len(idx):
                continue
            at = pos[idx].astype(np.uint64)
            base = line_no[idx] << self.shift
            lo = np.maximum(addr[idx], base) - base
            hi = np.minimum(addr[idx] + size[idx], base + np.uint64(self.line)) - base
            store = (c["kind"][idx] == 2).astype(np.uint64)
            b = self.bits
            self.ranges.add((((at << b | lo) << b | hi) << np.uint64(1)) | store, [None])
            self.data.add((at << np.uint64(32)) | c["did"][idx].astype(np.uint64), [None])
            fid = (c["fid"][idx].astype(np.int64) + 1).astype(np.uint64)
            self.functions.add((at << np.uint64(32)) | fid, [None])

    def into(self, thread: int, uses: dict[tuple[int, int], _ThreadUse]) -> None:
        b = int(self.bits)
        mask = (1 << b) - 1
        numbers = self.lines.tolist()

        def use(at: int) -> _ThreadUse:
            key = (numbers[at], thread)
            u = uses.get(key)
            if u is None:
                u = uses[key] = _ThreadUse()
            return u

        keys, sums, _ = self.ranges.result()
        for key, (n,) in zip(keys.tolist(), sums.tolist()):
            store, hi, lo, at = key & 1, (key >> 1) & mask, (key >> (1 + b)) & mask, key >> (1 + 2 * b)
            u = use(at)
            bits = ((1 << (hi - lo)) - 1) << lo
            u.touched |= bits
            if store:
                u.stores += n
                u.stored |= bits
            else:
                u.loads += n
        for tally, field_of in ((self.data, lambda u: u.data), (self.functions, lambda u: u.functions)):
            keys, _, _ = tally.result()
            for key in keys.tolist():
                ident = key & 0xFFFFFFFF
                field_of(use(key >> 32)).add(ident if tally is self.data else ident - 1)


def _lines(
    stream: AccessStream,
    labels: list[str],
    lines: np.ndarray,
    transfers: np.ndarray,
    uses: dict[tuple[int, int], _ThreadUse],
    line: int,
) -> list[dict]:
    by_line: dict[int, list[tuple[int, _ThreadUse]]] = {}
    for (ln, thread), u in uses.items():
        by_line.setdefault(ln, []).append((thread, u))
    moved = dict(zip(lines.tolist(), transfers.tolist()))
    out: list[dict[str, Any]] = []
    for ln, threads in by_line.items():
        threads.sort()
        storers = [t for t, u in threads if u.stores]
        if len(threads) < 2 or not storers:
            continue
        overlap = any(a.stored & b.touched for ta, a in threads for tb, b in threads if ta != tb)
        per_thread: list[dict[str, Any]] = [
            {
                "tid": stream.tids[t],
                "loads": u.loads,
                "stores": u.stores,
                "bytes": _byte_ranges(u.touched),
                "stored_bytes": _byte_ranges(u.stored),
                "data": sorted({labels[d] for d in u.data}),
                "functions": sorted({stream.function_name(f) for f in u.functions}),
            }
            for t, u in threads
        ]
        out.append(
            {
                "address": ln * line,
                "kind": "true" if overlap else "false",
                "threads": [p["tid"] for p in per_thread],
                "stores": sum(p["stores"] for p in per_thread),
                "loads": sum(p["loads"] for p in per_thread),
                "transfers": int(moved.get(ln, 0)),
                "data": sorted({d for p in per_thread for d in p["data"]}),
                "functions": sorted({f for p in per_thread for f in p["functions"]}),
                "per_thread": per_thread,
            }
        )
    out.sort(key=lambda r: (-r["transfers"], -(r["stores"] + r["loads"]), r["address"]))
    return out
