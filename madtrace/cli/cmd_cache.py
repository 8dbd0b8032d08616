# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace cache list|clear [--json]: the DWARF cache (binary/dwarf_cache.py) and
the module-scan cache (calls/scan_cache.py), the ELF symbol cache
(binary/elfcache.py), the copier's instruction entries (data/hybrid/entry_cache.py)
its function analyses (data/hybrid/analysis_cache.py) and the functions it relocated
(data/hybrid/discovery_cache.py) beside it."""

from __future__ import annotations

import json
import time

from ..binary import dwarf_cache, elfcache
from ..cache import disk
from ..data.hybrid import analysis_cache, discovery_cache, entry_cache
from ..calls import scan_cache

NAME = "cache"
HELP = ("list or clear the symbol cache (DWARF variables and line tables, call-site scans, "
        "once per binary)")


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=("list", "clear"),
                        help="list: every cached binary; clear: remove them all")
    parser.add_argument("--json", action="store_true", help="list: one JSON object")


def run(args) -> int:
    folder = disk.cache_dir()
    if args.action == "clear":
        files, size = dwarf_cache.clear()
        for kind in (scan_cache, elfcache, entry_cache, analysis_cache, discovery_cache):
            more_files, more_size = kind.clear()
            files, size = files + more_files, size + more_size
        print(f"removed {files} entries ({size / 1e6:.1f} MB) from {folder}")
        return 0
    entries, scans, tables = dwarf_cache.list_entries(), scan_cache.list_entries(), elfcache.list_entries()
    copier, analyses = entry_cache.list_entries(), analysis_cache.list_entries()
    learnt = discovery_cache.list_entries()
    if args.json:
        print(json.dumps({"directory": folder, "entries": entries, "scans": scans,
                          "symbol_tables": tables, "copier_entries": copier,
                          "copier_analyses": analyses, "relocated_functions": learnt}))
        return 0
    total = sum(e["bytes"] for e in entries + scans + tables + copier + analyses + learnt)
    print(f"{folder}: {len(entries)} entries, {len(scans)} call-site scans, {len(tables)} symbol "
          f"tables, {len(copier)} copier entry files, {len(analyses)} copier analysis files, "
          f"{len(learnt)} lists of relocated functions, {total / 1e6:.1f} MB")
    for e in entries + scans + tables + copier + analyses + learnt:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["created"])) if e.get("created") \
            else "?"
        what = (e["binary"] + (f" (runs of {e['program']})" if e.get("program") else "")
                if e["ok"] else f"CORRUPT ({e.get('problem')}): rebuilt when next used")
        print(f"  {e['bytes'] / 1e6:8.2f} MB  {when}  {what}")
    return 0
