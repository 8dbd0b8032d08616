# SPDX-License-Identifier: GPL-2.0-or-later
"""The module-scan cache: a binary's call-site scan (``find_call_sites``: its
direct call sites, unpatchable transfers, function starts and every direct
branch) and its address-taken functions (``address_taken``), kept on disk
once per binary file, so that a new tracer process on a file seen before
loads them in milliseconds instead of decoding the code again (0.3 s for
glibc, 0.4-0.6 s for libpython on this project's VMs).

Same directory and key as the DWARF cache (cache/disk.py: GNU build-id
and file size, else a hash of path, size, inode and mtime; a rebuilt binary
has another key, its old entry is never read), one file ``<key>.scan``:
``MTSCAN01``, u32 header length, the header (JSON: format, the binary's path,
size, build-id, the scan's scalars and string tables, each array's dtype and
length, the payload's length and CRC-32), then the arrays one after the
other.  An entry whose magic, format, length, checksum or content is wrong is
rebuilt, and one line says so (``disk.notify``).  ``FORMAT`` changes
whenever the scanners' results change meaning (callsites.py).

``scan_of(image) -> (CallSiteScan, taken)``: from the cache, else scanned
and written.  The in-process cache per image (plan.py) stays in front.
"""

from __future__ import annotations

import time

import numpy as np

from ..arch.x86_64.callsites import CallSite, CallSiteScan, UnpatchableSite, address_taken, find_call_sites
from ..cache import disk
from ..cache.disk import CorruptEntry

MAGIC = b"MTSCAN01"
FORMAT = 1
SUFFIX = ".scan"
_SITE_KINDS = ("call", "jmp")
_BAD_KINDS = ("call", "jmp", "jmp8", "jcc")

seconds = 0.0           # spent in scan_of (loading or scanning)
loaded = 0              # entries read from the cache (a test's and a benchmark's account)
built = 0               # scans made and written


def entry_path(image) -> str | None:
    """Where ``image``'s entry is (None: no file to key it by)."""
    return disk.entry_path_of(image, SUFFIX)


def scan_of(image) -> tuple[CallSiteScan, set[int]]:
    """(find_call_sites(image), address_taken(image)), through the disk cache."""
    global seconds, loaded, built
    started = time.perf_counter()
    try:
        result, how = disk.cached(
            image, SUFFIX, MAGIC, FORMAT, "scan cache", decode,
            lambda: (find_call_sites(image), address_taken(image)),
            lambda scanned: encode(*scanned))
        loaded += how == "read"
        built += how == "written"
        return result
    finally:
        seconds += time.perf_counter() - started


# ------------------------------------------------------------------ the format
def _strings(values) -> tuple[list[str], np.ndarray]:
    """(table, index of each value in it, -1 for None)."""
    table: dict[str, int] = {}
    idx = [-1 if v is None else table.setdefault(v, len(table)) for v in values]
    return list(table), np.array(idx, np.int32)


def encode(scan: CallSiteScan, taken: set[int]) -> tuple[dict, bytes]:
    sites, bad = scan.sites, scan.unpatchable
    names, site_callers = _strings([s.caller for s in sites])
    bad_names, bad_callers = _strings([b.caller for b in bad])
    reasons, bad_reasons = _strings([b.reason for b in bad])
    arrays: dict[str, np.ndarray] = {
        "site_address": np.array([s.address for s in sites], np.int64),
        "site_kind": np.array([_SITE_KINDS.index(s.kind) for s in sites], np.uint8),
        "site_target": np.array([s.target for s in sites], np.int64),
        "site_caller": site_callers,
        "site_prefix": np.array([s.prefix_len for s in sites], np.int8),
        "bad_address": np.array([b.address for b in bad], np.int64),
        "bad_kind": np.array([_BAD_KINDS.index(b.kind) for b in bad], np.uint8),
        "bad_target": np.array([b.target for b in bad], np.int64),
        "bad_caller": bad_callers,
        "bad_size": np.array([b.size for b in bad], np.int8),
        "bad_reason": bad_reasons,
        "function_starts": np.array(sorted(scan.function_starts), np.int64),
        "branch_targets": np.ascontiguousarray(scan.branch_targets, np.int64),
        "branch_sources": np.ascontiguousarray(scan.branch_sources, np.int64),
        "taken": np.array(sorted(taken), np.int64),
    }
    header = {"instructions": scan.instructions, "sections": scan.sections, "names": names,
              "bad_names": bad_names, "reasons": reasons,
              "arrays": [[k, a.dtype.str, len(a)] for k, a in arrays.items()]}
    return header, b"".join(a.tobytes() for a in arrays.values())


def decode(header: dict, payload: bytes) -> tuple[CallSiteScan, set[int]]:
    """What ``encode`` wrote; CorruptEntry when it does not hold together."""
    try:
        arrays = disk.unpack_arrays(header, payload)
        names, bad_names, reasons = header["names"], header["bad_names"], header["reasons"]
        bad = [UnpatchableSite(a, _BAD_KINDS[k], t, bad_names[c] if c >= 0 else None, s, reasons[r])
               for a, k, t, c, s, r in zip(arrays["bad_address"].tolist(), arrays["bad_kind"].tolist(),
                                           arrays["bad_target"].tolist(), arrays["bad_caller"].tolist(),
                                           arrays["bad_size"].tolist(), arrays["bad_reason"].tolist())]
        n = len(arrays["site_address"])
        if any(len(arrays[k]) != n for k in ("site_kind", "site_target", "site_caller", "site_prefix")):
            raise CorruptEntry("site arrays differ in length")
        if n and (int(arrays["site_kind"].max()) >= len(_SITE_KINDS)
                  or int(arrays["site_caller"].max()) >= len(names)):
            raise CorruptEntry("a site's kind or caller is out of range")
        scan = CachedScan(arrays, names, bad, frozenset(arrays["function_starts"].tolist()),
                          int(header["instructions"]), list(header["sections"]))
        return scan, set(arrays["taken"].tolist())
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CorruptEntry(f"bad content ({type(exc).__name__}: {exc})") from None


class CachedScan(CallSiteScan):
    """A CallSiteScan read from the cache: its sites stay in arrays until asked
    for (45 000 CallSite objects cost ~60 ms for libpython; a plan wants the
    sites of a few targets): ``sites_to(target)`` builds only those."""

    def __init__(self, arrays: dict, names: list[str], unpatchable: list[UnpatchableSite],
                 function_starts: frozenset, instructions: int, sections: list[str]):
        self.unpatchable = unpatchable
        self.function_starts = function_starts
        self.instructions = instructions
        self.sections = sections
        self.branch_targets = arrays["branch_targets"]
        self.branch_sources = arrays["branch_sources"]
        self._arrays, self._names = arrays, names
        self._sites: list[CallSite] | None = None
        self._order = np.argsort(arrays["site_target"], kind="stable")   # by target, then address
        self._sorted_targets = arrays["site_target"][self._order]

    def _site(self, i: int) -> CallSite:
        a, names = self._arrays, self._names
        caller = int(a["site_caller"][i])
        return CallSite(int(a["site_address"][i]), _SITE_KINDS[a["site_kind"][i]],
                        int(a["site_target"][i]), names[caller] if caller >= 0 else None,
                        int(a["site_prefix"][i]))

    @property
    def sites(self) -> list[CallSite]:     # type: ignore[override]
        if self._sites is None:
            self._sites = [self._site(i) for i in range(len(self._arrays["site_address"]))]
        return self._sites

    def sites_to(self, target: int) -> list[CallSite]:
        lo, hi = np.searchsorted(self._sorted_targets, [target, target + 1])
        return [self._site(int(i)) for i in self._order[lo:hi]]


def list_entries() -> list[dict]:
    return disk.list_entries(SUFFIX, MAGIC, FORMAT)


def clear() -> tuple[int, int]:
    return disk.clear(SUFFIX)
