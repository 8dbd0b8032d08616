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

``pages`` ranges are bound to their node; other pages follow ``policy``:
``first-touch`` (default for a simulated topology): the node of the thread
that touched the page first, when pinned; ``observed``: the recorded node
(when the topology has it).  First touch means the first traced access (a
page touched before tracing began counts at its first traced access), and a
page address reused after munmap is one page.  Memory: a few numbers per
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
from .trace_input import Progress, access_rows, require_accesses

METRICS = ("first_touch", "unpinned_first_touch", "local", "remote", "unpinned_page",
           "unpinned_thread", "unpinned_both", "unknown_node")
LOCAL, REMOTE, UNPINNED_PAGE, UNPINNED_THREAD, UNPINNED_BOTH, UNKNOWN_NODE = range(2, 8)
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

    def bound_node(self, address: int) -> int | None:
        for start, end, node in self.ranges:
            if start <= address < end:
                return node
        return None

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
def _first_touches(directory: str, bindings: Bindings, progress: Progress):
    """{page: (order, tid, rip, thread node)} of each page's first access: each
    thread's first access to each page (its orders grow: the first met), then
    the earliest of the threads'."""
    first: dict[int, tuple] = {}

    def merge(tid: int, seen: dict) -> None:
        orders = np.array([o for o, _ in seen.values()], dtype=np.uint64)
        nodes = bindings.nodes_at(tid, orders).tolist() if len(orders) else []
        for (page, (order, rip)), node in zip(seen.items(), nodes):
            if page not in first or order < first[page][0]:
                first[page] = (order, tid, rip, node)

    current, tally, seen = None, None, {}
    for tid, chunk in iter_access_chunks(directory):
        if tid != current:
            if current is not None:
                merge(current, seen)
                tally.close()
            current, tally, seen = tid, Tally(1), {}
        progress.add(len(chunk))
        before, base = tally.size(), tally.rows
        tally.add(chunk["addr"] >> np.uint64(SHIFT), [None])
        keys, _, rows = tally.result()
        for page, i in zip(keys[before:].tolist(), (rows[before:] - base).tolist()):
            seen[page] = (int(chunk["order"][i]), int(chunk["rip"][i]))
    if current is not None:
        merge(current, seen)
        tally.close()
    return first


def _observed_nodes(recorded: dict) -> dict[int, int]:
    """{page: node} from the move_pages observations (the earliest of each page)."""
    out: dict[int, tuple[int, int]] = {}
    for order, start, count, node in recorded["pages"]:
        for k in range(count):
            page = (start >> SHIFT) + k
            if page not in out or order < out[page][0]:
                out[page] = (order, node)
    return {page: node for page, (_, node) in out.items()}


class PageTable:
    """Sorted pages with their first touch, pinned flag and node."""

    def __init__(self, first: dict, observed: dict[int, int], topology: Topology):
        self.pages = np.array(sorted(first), dtype=np.uint64)
        n = len(self.pages)
        self.first_order = np.zeros(n, dtype=np.uint64)
        self.first_tid = np.zeros(n, dtype=np.int64)
        self.pinned = np.zeros(n, dtype=bool)
        self.node = np.full(n, UNPINNED, dtype=np.int64)
        for i, page in enumerate(self.pages.tolist()):
            order, tid, _rip, thread_node = first[page]
            self.first_order[i], self.first_tid[i] = order, tid
            bound = topology.bound_node(page << SHIFT)
            if bound is not None:
                self.pinned[i], self.node[i] = True, bound
                continue
            self.pinned[i] = thread_node != UNPINNED
            seen = observed.get(page)
            if seen is not None and seen not in topology.nodes:
                seen = None
            if topology.policy == "first-touch" and thread_node != UNPINNED:
                self.node[i] = thread_node
            elif seen is not None:
                self.node[i] = seen

    def index(self, pages: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.pages, pages)


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


def _categories(thread_node: np.ndarray, page_pinned: np.ndarray, page_node: np.ndarray):
    tpin = thread_node != UNPINNED
    return np.select(
        [tpin & page_pinned & (page_node == UNPINNED), tpin & page_pinned & (page_node == thread_node),
         tpin & page_pinned, tpin & ~page_pinned, ~tpin & page_pinned],
        [UNKNOWN_NODE, LOCAL, REMOTE, UNPINNED_PAGE, UNPINNED_THREAD], UNPINNED_BOTH)


class _Table:
    """Metric counters per key (int), accumulated from chunks."""

    def __init__(self):
        self.rows: dict[int, np.ndarray] = {}
        # key << 3 | category -> accesses, first touches, unpinned first touches
        self.tally = Tally(3)

    def add(self, keys: np.ndarray, category: np.ndarray, first: np.ndarray,
            unpinned_first: np.ndarray) -> None:
        self.tally.add((keys.astype(np.int64) << 3 | category).view(np.uint64),
                       [None, first, unpinned_first])

    def finish(self) -> "_Table":
        """The tallied counts into ``rows``."""
        keys, sums, _ = self.tally.result()
        self.tally.close()
        self.tally = Tally(3)
        for key, (n, first, unpinned) in zip(keys.view(np.int64).tolist(), sums.tolist()):
            row = self.rows.get(key >> 3)
            if row is None:
                row = self.rows[key >> 3] = np.zeros(len(METRICS), dtype=np.int64)
            row[key & 7] += n
            row[0] += first
            row[1] += unpinned
        return self


def numa_report(directory: str, topology: Topology | None = None) -> NumaReport:
    require_accesses(directory, "numa")
    recorded = load_recorded(directory)
    if topology is None:
        topology = Topology({int(n): c for n, c in recorded["nodes"].items()}, "observed")
    bindings = Bindings(recorded, topology)
    progress = Progress("numa", 2 * access_rows(directory))
    first = _first_touches(directory, bindings, progress)
    table = PageTable(first, _observed_nodes(recorded), topology)
    by_rip, by_group, by_thread = _Table(), _Table(), _Table()
    matrix: dict[int, dict[int, int]] = {}
    for tid, chunk in iter_access_chunks(directory):
        progress.add(len(chunk))
        i = table.index(chunk["addr"] >> np.uint64(SHIFT))
        thread_node = bindings.nodes_at(tid, chunk["order"])
        category = _categories(thread_node, table.pinned[i], table.node[i])
        first_touch = (chunk["order"] == table.first_order[i]) & (table.first_tid[i] == tid)
        unpinned_first = first_touch & (thread_node == UNPINNED)
        by_rip.add(chunk["rip"].astype(np.int64), category, first_touch, unpinned_first)
        # allocation groups: block id > 0, or -(page index + 1) for accesses outside blocks
        group = np.where(chunk["block"] > 0, chunk["block"].astype(np.int64), -(i + 1))
        by_group.add(group, category, first_touch, unpinned_first)
        by_thread.add(np.full(len(chunk), tid, dtype=np.int64), category, first_touch,
                      unpinned_first)
        nodes, n = np.unique(table.node[i], return_counts=True)
        row = matrix.setdefault(tid, {})
        for node, c in zip(nodes.tolist(), n.tolist()):
            row[node] = row.get(node, 0) + c
    for table_ in (by_rip, by_group, by_thread):
        table_.finish()
    space = address_space_of(directory)
    access_sites = _rows(by_rip.rows, lambda rip: {"site": space.code_location(rip), "rip": rip})
    blocks = {b["id"]: b for b in load_allocations(directory)}
    groups: dict[str, np.ndarray] = {}
    for key, row in by_group.rows.items():
        if key > 0:
            name = blocks[key]["site"] if key in blocks else f"<block {key}>"
        else:
            region = space.region(int(table.pages[-key - 1]) << SHIFT)
            name = region if region.startswith("[") else f"[{region}]"
        groups[name] = groups[name] + row if name in groups else row.copy()
    allocation_sites = _rows(groups, lambda name: {"site": name})
    threads = _rows(by_thread.rows, lambda tid: {
        "tid": tid, "bindings": [{"order": o, "cpus": c} for o, c in bindings.masks.get(tid, [])],
        "node_at_start": int(bindings.nodes_at(tid, np.zeros(1, dtype=np.uint64))[0])})
    totals = {m: int(sum(r[k] for r in by_thread.rows.values())) for k, m in enumerate(METRICS)}
    totals["accesses"] = sum(totals[m] for m in METRICS[2:])
    totals["pages"] = len(table.pages)
    return NumaReport(directory, topology, totals, access_sites, allocation_sites, threads, matrix)


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
