# SPDX-License-Identifier: GPL-2.0-or-later
"""NUMAPROF's metrics (madtrace report DIR --kind numa).

Every access is judged with the binding its thread had when it happened and
the page it touched:

* a thread is *pinned* when its CPU mask lies within one node's CPUs (its
  node), else *unpinned*;
* a page is *pinned* when the thread that touched it first was pinned then
  (first-touch placement put it on that thread's node), or when the topology
  places it explicitly (like mbind); else it was placed "at random";
* the page's node: where move_pages said it was (data/numa.json, recorded
  with --data), or with a simulated topology the node its placement gives.

Each access counts in exactly one of ``local`` (pinned thread, pinned page,
same node), ``remote`` (different nodes), ``unpinned_page``,
``unpinned_thread``, ``unpinned_both``, ``unknown_node`` (pinned both, the
page's node unknown: never observed); the first access to each page also
counts as ``first_touch`` (``unpinned_first_touch`` when its thread was
unpinned).  Totals per access site (instruction), per allocation site (the
block's allocator call site; accesses outside heap blocks under their
region, ``[.bss of prog]``), per thread, and a thread x node matrix.

``Topology``: nodes -> CPUs and how pages get their node.  The recorded one
(the machine's nodes, observed page nodes) is the default; ``--topology
FILE`` injects a simulated one, a JSON object::

    {"nodes": {"0": [0], "1": [1]},            # node -> CPUs
     "pages": [["0x7f0000000000", "0x7f0000004000", 1], ...],   # optional
     "policy": "first-touch"}                  # or "observed"

``pages`` ranges are bound to their node (the first range that holds the
page); other pages follow ``policy``: ``first-touch`` (default for a
simulated topology): the node of the thread that touched the page first,
when pinned; ``observed``: the recorded node (when the topology has it).
First touch means the first traced access (a page touched before tracing
began counts at its first traced access), and a page address reused after
munmap is one page.

Each access is judged in C (access_counters.c), in the pass over the
accesses the report's kinds share (shared_pass.py); with more than one
thread, a first pass finds the first touches.  Memory: a few numbers per
distinct page and per access site.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..errors import NoDataError, UsageError
from ..trace.blocks import load_allocations
from ..trace.format import NUMA_FILE, PAGE_SHIFT as SHIFT, load_numa
from ..trace.naming import address_space_of
from ..trace.access_pass import Tally
from ..trace.reader import iter_access_chunks
from .access_counters import NumaCounter
from .shared_pass import CHUNK_ROWS, Part, SharedPass, run_parts
from .trace_input import Progress, access_rows, require_accesses

# the first touches, then the categories of an access (access_counters.c gives each
# access its category: its index here)
METRICS = ("first_touch", "unpinned_first_touch", "local", "remote", "unpinned_page",
           "unpinned_thread", "unpinned_both", "unknown_node")
UNPINNED = -1


@dataclass
class Topology:
    nodes: dict[int, list[int]]
    policy: str = "observed"                    # or "first-touch"
    ranges: list[tuple[int, int, int]] = field(default_factory=list)
    source: str = "recorded"

    def node_of_cpus(self, cpus) -> int:
        """The node a CPU mask lies within, or UNPINNED."""
        cpus = set(cpus)
        for node, node_cpus in self.nodes.items():
            if cpus and cpus <= set(node_cpus):
                return node
        return UNPINNED

    def to_dict(self) -> dict:
        return {"source": self.source, "policy": self.policy,
                "nodes": {str(n): c for n, c in self.nodes.items()},
                "pages": [[s, e, n] for s, e, n in self.ranges]}


def _int(value) -> int:
    return int(value, 0) if isinstance(value, str) else int(value)


def load_topology(path: str) -> Topology:
    try:
        with open(path) as f:
            doc = json.load(f)
        nodes = {int(n): sorted(int(c) for c in cpus) for n, cpus in doc["nodes"].items()}
        ranges = [(_int(s), _int(e), int(n)) for s, e, n in doc.get("pages", [])]
        policy = doc.get("policy", "first-touch")
    except FileNotFoundError:
        raise UsageError(f"--topology {path}: no such file") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--topology {path}: not a topology description "
                         f"({type(exc).__name__}: {exc})".replace("\n", " ")) from None
    if policy not in ("first-touch", "observed") or not nodes:
        raise UsageError(f"--topology {path}: needs \"nodes\" and a policy of "
                         "\"first-touch\" or \"observed\"")
    if any(n not in nodes for _, _, n in ranges):
        raise UsageError(f"--topology {path}: a page range names a node not in \"nodes\"")
    return Topology(nodes, policy, ranges, source=path)


def load_recorded(directory: str) -> dict:
    doc = load_numa(directory)
    if doc is None:
        raise NoDataError(f"{directory} has no NUMA observations ({NUMA_FILE}): record it "
                          "again with --data (this madtrace records them)")
    return doc


# ------------------------------------------------------------------ threads
class Bindings:
    """The node of each thread (UNPINNED) as its binding changed over time."""

    def __init__(self, recorded: dict, topology: Topology):
        self.history: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.masks: dict[int, list] = {}
        for tid, events in recorded["threads"].items():
            events = sorted(events, key=lambda e: e[0])
            orders = np.array([e[0] for e in events], dtype=np.uint64)
            nodes = np.array([topology.node_of_cpus(e[1]) for e in events], dtype=np.int64)
            self.history[int(tid)] = (orders, nodes)
            self.masks[int(tid)] = events

    def nodes_at(self, tid: int, orders: np.ndarray) -> np.ndarray:
        if tid not in self.history:
            return np.full(len(orders), UNPINNED, dtype=np.int64)   # binding never seen
        at, nodes = self.history[tid]
        i = np.searchsorted(at, orders, side="right").astype(np.int64) - 1
        return np.where(i >= 0, nodes[np.maximum(i, 0)], nodes[0])


# -------------------------------------------------------------------- pages
def _observed_nodes(recorded: dict, topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    """(pages sorted, nodes) from the move_pages observations (the earliest of
    each page), those on a node of the topology."""
    out: dict[int, tuple[int, int]] = {}
    for order, start, count, node in recorded["pages"]:
        for k in range(count):
            page = (start >> SHIFT) + k
            if page not in out or order < out[page][0]:
                out[page] = (order, node)
    pages = sorted(page for page, (_, node) in out.items() if node in topology.nodes)
    return (np.array(pages, dtype=np.uint64),
            np.array([out[page][1] for page in pages], dtype=np.int64))


# ----------------------------------------------------------------- analysis
@dataclass
class NumaReport:
    directory: str
    topology: Topology
    totals: dict
    access_sites: list[dict]
    allocation_sites: list[dict]
    threads: list[dict]
    matrix: dict                     # tid -> {node: accesses}

    def to_dict(self) -> dict:
        return {"kind": "numa", "directory": self.directory, "metrics": list(METRICS),
                "topology": self.topology.to_dict(), "totals": self.totals,
                "access_sites": self.access_sites, "allocation_sites": self.allocation_sites,
                "threads": self.threads,
                "matrix": {str(t): {str(n): c for n, c in row.items()}
                           for t, row in self.matrix.items()}}


def _metric_rows(tally: Tally) -> dict[int, np.ndarray]:
    """The METRICS of each key of a tally of ``key << 3 | category`` -> accesses,
    first touches, unpinned first touches (keys in the order first met)."""
    keys, sums, _ = tally.result()
    rows: dict[int, np.ndarray] = {}
    for key, (n, first, unpinned) in zip(keys.view(np.int64).tolist(), sums.tolist()):
        row = rows.get(key >> 3)
        if row is None:
            row = rows[key >> 3] = np.zeros(len(METRICS), dtype=np.int64)
        row[key & 7] += n
        row[0] += first
        row[1] += unpinned
    return rows


class NumaPart(Part):
    """The NUMA metrics as a part of the shared pass (access_counters.c counts:
    the first touches, each access's category, the tallies).  Each access
    needs its page's first touch: with one thread the first access met, with
    more a pass over every thread's accesses finds them first (``prepare``)."""

    label = "numa"

    def __init__(self, directory: str, topology: Topology | None = None):
        require_accesses(directory, "numa")
        recorded = load_recorded(directory)
        if topology is None:
            topology = Topology({int(n): c for n, c in recorded["nodes"].items()}, "observed")
        self.directory, self.topology = directory, topology
        self.bindings = Bindings(recorded, topology)
        ranges = topology.ranges
        self.numa = NumaCounter(([s for s, _, _ in ranges], [e for _, e, _ in ranges],
                                 [n for _, _, n in ranges]),
                                _observed_nodes(recorded, topology),
                                topology.policy == "first-touch")
        self.counter = ("numa", self.numa)

    def _binding(self, tid: int) -> None:
        orders, nodes = self.bindings.history.get(tid, (np.zeros(0, np.uint64),
                                                        np.zeros(0, np.int64)))
        self.numa.thread(tid, orders, nodes)

    def prepare(self, shared: SharedPass) -> None:
        if len(shared.tids) < 2:
            return
        progress = Progress("numa: first touches", access_rows(self.directory))
        current = None
        for tid, chunk in iter_access_chunks(self.directory, chunk_rows=CHUNK_ROWS):
            if tid != current:
                current = tid
                self._binding(tid)
            progress.add(len(chunk))
            self.numa.first_touches(chunk)
        self.numa.classify()

    def thread(self, tid: int) -> None:
        self._binding(tid)

    def result(self) -> NumaReport:
        numa, bindings = self.numa, self.bindings
        pages = numa.pages()
        by_rip, by_group, by_thread = (_metric_rows(t) for t in (numa.by_rip, numa.by_group,
                                                                  numa.by_thread))
        keys, sums, _ = numa.matrix.result()
        cells: dict[int, dict[int, int]] = {}
        for key, (n,) in zip(keys.tolist(), sums.tolist()):
            cells.setdefault(key >> 32, {})[(key & 0xFFFFFFFF) - 1] = n
        matrix = {tid: dict(sorted(row.items())) for tid, row in cells.items()}
        space = address_space_of(self.directory)
        access_sites = _rows(by_rip, lambda rip: {"site": space.code_location(rip), "rip": rip})
        blocks = {b["id"]: b for b in load_allocations(self.directory)}
        groups: dict[str, np.ndarray] = {}
        for key, row in by_group.items():
            if key > 0:
                name = blocks[key]["site"] if key in blocks else f"<block {key}>"
            else:
                region = space.region(int(pages[-key - 1]) << SHIFT)
                name = region if region.startswith("[") else f"[{region}]"
            groups[name] = groups[name] + row if name in groups else row.copy()
        allocation_sites = _rows(groups, lambda name: {"site": name})
        threads = _rows(by_thread, lambda tid: {
            "tid": tid, "bindings": [{"order": o, "cpus": c} for o, c in bindings.masks.get(tid, [])],
            "node_at_start": int(bindings.nodes_at(tid, np.zeros(1, dtype=np.uint64))[0])})
        totals = {m: int(sum(r[k] for r in by_thread.values())) for k, m in enumerate(METRICS)}
        totals["accesses"] = sum(totals[m] for m in METRICS[2:])
        totals["pages"] = len(pages)
        return NumaReport(self.directory, self.topology, totals, access_sites, allocation_sites,
                          threads, matrix)

    def close(self) -> None:
        self.numa.close()


def numa_report(directory: str, topology: Topology | None = None) -> NumaReport:
    return run_parts(directory, [NumaPart(directory, topology)])[0]


def _rows(rows: dict, describe) -> list[dict]:
    out = []
    for key, row in rows.items():
        entry = describe(key)
        entry.update({m: int(row[k]) for k, m in enumerate(METRICS)})
        entry["accesses"] = int(row[2:].sum())
        out.append(entry)
    out.sort(key=lambda e: (-(e["remote"] + e["unpinned_page"] + e["unpinned_thread"]
                              + e["unpinned_both"]), -e["accesses"], str(e.get("site", e.get("tid")))))
    return out
