"""madtrace summary DIR [--json]"""

from __future__ import annotations

import json
import os
import sys

from ..trace.format import META_FILE
from ..trace.meta import read_meta

NAME = "summary"
HELP = "print the summary of a trace directory (one JSON object with --json)"

SUMMARY_KEYS = ("exit_status", "exit_signal", "threads", "calls", "accesses", "dropped_events",
                "mode", "command", "pid", "outcome", "stop_reason", "forks", "signals_forwarded",
                "symbols", "images", "processes", "unmatched_functions", "partial", "tracer")


TOP = 15
TOP_DATA = 8       # variables and heap blocks listed


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="trace directory written by madtrace record/attach")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def data_totals(directory: str, top: int = TOP_DATA, out=sys.stderr) -> dict:
    """From the raw capture (no store needed): per function the calls and the
    accesses and bytes made while it was the innermost traced call (self) or
    anywhere on the stack (incl, a recursion counted once: the outermost
    calls' inclusive counts); the most accessed variables and heap blocks (a
    block by the name it had while live; after_free: the program's accesses to
    it once freed, the allocator's own bookkeeping is not a use after free);
    the accesses per region."""
    from ..progress import Progress
    from ..trace.access_counts import access_totals
    from ..trace.blocks import block_name, load_block_table
    from ..trace.meta import accesses_recorded
    from ..trace.record_files import CALL_RECORDS
    events = accesses_recorded(directory) + sum(CALL_RECORDS.rows(p) for _, p in CALL_RECORDS.files(directory))
    progress = Progress("counting the trace", events, out)
    totals = access_totals(directory, progress)
    progress.done()
    d, counts = totals.data, totals.counts
    regions: dict[str, list[int]] = {}
    variables: dict[str, list] = {}
    blocks: dict[int, list[int]] = {}
    for i, (symbol, region, block) in enumerate(zip(d.get("symbol", []), d.get("region", []),
                                                    d.get("block", []))):
        loads, stores, size, after_free = (int(v) for v in counts[i])
        r = regions.setdefault(region, [0, 0, 0])
        r[0] += loads
        r[1] += stores
        r[2] += size
        if block:
            b = blocks.setdefault(block, [0, 0, 0])
            b[0] += loads + stores
            b[1] += size
            b[2] += after_free
        elif symbol is not None:
            v = variables.setdefault(symbol, [region, 0, 0])
            v[1] += loads + stores
            v[2] += size
    table = load_block_table(directory)
    top_blocks = []
    for block, (n, size, after_free) in sorted(blocks.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]:
        row = table.rows[block - 1]
        top_blocks.append({"id": block, "name": block_name(table.kinds[int(row["kind"])], block,
                                                           table.sites[int(row["site"])], False),
                           "size": int(row["size"]), "accesses": n, "bytes": size,
                           "after_free": after_free})
    region_rows: list[dict] = [{"region": r, "module": module_of_region(r), "loads": lo, "stores": st,
                    "bytes": b} for r, (lo, st, b) in
                   sorted(regions.items(), key=lambda kv: (-(kv[1][0] + kv[1][1]), kv[0]))]
    modules: dict[str, dict] = {}
    for row in region_rows:
        m = modules.setdefault(str(row["module"]), {"loads": 0, "stores": 0, "bytes": 0})
        for key in m:
            m[key] += int(row[key])
    return {"functions": totals.functions,
            "top_variables": [{"name": n, "region": r, "accesses": c, "bytes": b}
                              for n, (r, c, b) in sorted(variables.items(),
                                                         key=lambda kv: (-kv[1][1], kv[0]))[:top]],
            "top_blocks": top_blocks, "regions": region_rows, "accesses_by_module": modules}


def module_of_region(region: str) -> str:
    """".bss of gzip" -> "gzip"; a region of no module ([heap], [anon ...]) is its own."""
    return region.rsplit(" of ", 1)[1] if " of " in region else region


def summary_of(meta: dict) -> dict:
    summary = {key: meta.get(key) for key in SUMMARY_KEYS}
    summary["duration_s"] = round(meta["end_time"] - meta["start_time"], 6) \
        if "end_time" in meta and "start_time" in meta else None
    summary["modules"] = {m["name"]: {k: v for k, v in m.items() if k != "name"}
                          for m in meta.get("modules", [])}
    return summary


def print_human_summary(meta: dict, directory: str, out, totals: dict | None = None) -> None:
    """``totals``: data_totals() of the directory (None: not shown)."""
    s = summary_of(meta)
    command = " ".join(s["command"] or []) or f"pid {s['pid']}"
    flight = meta.get("flight")
    if flight:
        ending = (f"a flight recorder's snapshot ({flight.get('trigger')}): the last "
                  f"{flight.get('seconds', 0):.3f} s, written")
    elif s["outcome"] == "snapshot":
        ending = "still running: a snapshot written by the REPL's save,"
    elif s["outcome"] == "tracer killed":
        ending = "cut short: madtrace was killed (a partial trace: what reached the disk),"
    elif s["outcome"] == "running":
        ending = "still being recorded (a live trace directory),"
    elif s["outcome"] == "exec":
        ending = f"exec of {' '.join(meta.get('next_command') or [])[:60]} ({meta.get('next_image')})"
    elif s["exit_signal"]:
        ending = f"killed by signal {s['exit_signal']}"
    elif s["exit_status"] is not None:
        ending = f"exit status {s['exit_status']}"
    else:
        ending = f"detached ({s['stop_reason']})"
    print(f"== madtrace summary of {directory}", file=out)
    print(f"   target   : {command}", file=out)
    label = "state" if s["outcome"] in ("snapshot", "running") or flight else "ended"
    print(f"   {label:<9}: {ending} after {s['duration_s']:.3f} s", file=out)
    if meta.get("untraced"):
        print(f"   untraced : {meta['untraced']}", file=out)
    print(f"   threads  : {s['threads']}   forks: {s['forks']}   "
          f"signals forwarded: {s['signals_forwarded']}", file=out)
    print(f"   modules  : {len(s['modules'])} ({s['symbols']} symbols)", file=out)
    for name, m in s["modules"].items():
        flag = "  [stripped]" if m.get("stripped") else ""
        print(f"     {name:<28} {m.get('symbols', 0):>7} symbols  bias {m.get('bias', 0):#x}{flag}",
              file=out)
    calls = s.get("calls") or {}
    if calls:
        ft = meta.get("function_tracing", {})
        report = ft.get("patch_report", {})
        print(f"   functions: {len(calls)} traced, {sum(calls.values())} calls, "
              f"{ft.get('records', 0)} records, {len(report.get('skipped', []))} not traced"
              f"{', timestamps off' if not ft.get('timestamps', True) else ''}", file=out)
        for name, n in sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]:
            if n:
                print(f"     {n:>12}  {name}", file=out)
        for item in report.get("inexact", []):
            print(f"   inexact: {item['what']}: {item['why']}", file=out)
    if totals is not None:
        print_data_totals(totals, meta, out)
    dropped = s["dropped_events"]
    print(f"   dropped events: {'unknown (not counted yet)' if dropped is None else dropped}",
          file=out)
    windows = (meta.get("data_tracing") or {}).get("open_windows", 0)
    if windows:
        from ..recording.results import open_windows_line
        tracing = meta["data_tracing"]
        line = open_windows_line(windows, tracing.get("open_window_pages", {}), tracing)
        print(f"   warning  : {line}", file=out)
    tracer = s.get("tracer") or {}
    if tracer:
        print(f"   tracer   : peak RSS {tracer['peak_rss_bytes'] / 2**20:.0f} MB, write-out "
              f"{tracer['write_seconds']:.2f} s after the target", file=out)
    print_images(meta, directory, out)


def print_images(meta: dict, directory: str, out) -> None:
    """The images of the process (exec) and the fork children followed: each a trace
    directory of its own under DIR."""
    for title, key in (("images (exec)", "images"), ("processes (fork)", "processes")):
        rows = meta.get(key) or []
        if not rows:
            continue
        print(f"   {title}: each a trace directory of its own", file=out)
        for row in rows:
            command = " ".join(row.get("command") or [])[:50]
            print(f"     {os.path.normpath(os.path.join(directory, row['dir'])):<30} {row.get('outcome') or '':<9} "
                  f"calls {row.get('calls', 0):>10}  accesses {row.get('accesses', 0):>10}  {command}",
                  file=out)
    if meta.get("unmatched_functions"):
        print(f"   never matched: -f {', '.join(meta['unmatched_functions'])}", file=out)


def print_data_totals(totals: dict, meta: dict, out) -> None:
    accesses = sum(c["L"] + c["S"] for c in (meta.get("accesses") or {}).values())
    if not accesses:
        return
    print(f"   accesses : {accesses}", file=out)
    if totals.get("regions"):
        print("   by region (loads, stores, bytes):", file=out)
        for r in totals["regions"][:TOP]:
            print(f"     {r['loads']:>10} L {r['stores']:>10} S {r['bytes']:>12} B  {r['region']}",
                  file=out)
        if len(totals["regions"]) > TOP:
            print(f"     ... {len(totals['regions']) - TOP} more regions (--json)", file=out)
    functions = sorted(((n, f) for n, f in totals["functions"].items() if f["accesses_incl"]),
                       key=lambda kv: (-kv[1]["accesses_self"], -kv[1]["accesses_incl"], kv[0]))
    if functions:
        width = max(len(n) for n, _ in functions[:TOP])
        print("   top functions by accesses (self: innermost traced call; incl: with callees):",
              file=out)
        for name, f in functions[:TOP]:
            print(f"     {name:<{width}}  self {f['accesses_self']:>10} ({f['bytes_self']} B)  "
                  f"incl {f['accesses_incl']:>10}  calls {f['calls']}", file=out)
    if totals["top_variables"]:
        print("   top variables:", file=out)
        for v in totals["top_variables"]:
            print(f"     {v['accesses']:>10}  {v['name']} [{v['region']}]", file=out)
    if totals["top_blocks"]:
        print("   top heap blocks:", file=out)
        for b in totals["top_blocks"]:
            freed = f", {b['after_free']} after free" if b["after_free"] else ""
            print(f"     {b['accesses']:>10}  {b['name']} ({b['size']} bytes{freed})", file=out)


def run(args) -> int:
    meta = read_meta(args.directory)
    totals = data_totals(args.directory)
    if args.json:
        summary = summary_of(meta)
        summary.update(totals)
        json.dump(summary, sys.stdout)
        sys.stdout.write("\n")
    else:
        print_human_summary(meta, args.directory, sys.stdout, totals)
    return 0


def totals_of_recording(directory: str) -> dict | None:
    """data_totals() of a recording just made (None for a directory it did not write)."""
    if not os.path.exists(os.path.join(directory, META_FILE)):
        return None
    return data_totals(directory)
