# SPDX-License-Identifier: GPL-2.0-or-later
"""NUMA facts about a traced process, read from outside it (no ptrace stop).

* ``node_cpus()``: the machine's NUMA nodes and their CPUs
  (/sys/devices/system/node/node*/cpulist; one node with every CPU when the
  kernel has no NUMA support).
* ``page_nodes(pid, pages)``: the node of each page of process ``pid``,
  from ``move_pages(pid, n, pages, NULL, status, 0)``: with no target nodes
  the call moves nothing and returns where each page is; a page never
  touched (no physical page) gets ``-ENOENT`` (-2), an unmapped one
  ``-EFAULT`` (-14).  Pages protected with PROT_NONE are answered too.
* ``thread_cpus(tid)``: the thread's CPU affinity mask (sched_getaffinity).
"""

from __future__ import annotations

import ctypes
import errno
import os

SYS_MOVE_PAGES = 279          # x86-64
BATCH = 1 << 16               # pages per move_pages call
NODE_DIR = "/sys/devices/system/node"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def node_cpus() -> dict[int, list[int]]:
    nodes: dict[int, list[int]] = {}
    try:
        names = os.listdir(NODE_DIR)
    except OSError:
        names = []
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            try:
                with open(os.path.join(NODE_DIR, name, "cpulist")) as f:
                    nodes[int(name[4:])] = parse_cpulist(f.read())
            except (OSError, ValueError):
                continue
    if not nodes:
        nodes[0] = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
    return dict(sorted(nodes.items()))


def page_nodes(pid: int, pages: list[int]) -> list[int]:
    """The node of each page (or -errno, see the module docstring)."""
    out: list[int] = []
    for i in range(0, len(pages), BATCH):
        batch = pages[i:i + BATCH]
        addresses = (ctypes.c_void_p * len(batch))(*batch)
        status = (ctypes.c_int * len(batch))(*([-errno.ENOENT] * len(batch)))
        result = _libc.syscall(SYS_MOVE_PAGES, ctypes.c_long(pid), ctypes.c_ulong(len(batch)),
                               addresses, None, status, ctypes.c_int(0))
        if result < 0:
            err = ctypes.get_errno()
            if err == errno.ESRCH:
                return out + [-errno.ESRCH] * (len(pages) - len(out))
            out.extend([-err] * len(batch))
            continue
        out.extend(status)
    return out


def thread_cpus(tid: int) -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(tid))
    except OSError:
        return None
