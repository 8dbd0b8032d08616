"""madtrace summary DIR [--json]"""

from __future__ import annotations

import json
import sys

from ..trace import store

NAME = "summary"
HELP = "print the summary of a trace directory (one JSON object with --json)"

SUMMARY_KEYS = ("exit_status", "exit_signal", "threads", "calls", "accesses", "dropped_events",
                "mode", "command", "pid", "outcome", "stop_reason", "forks", "signals_forwarded",
                "symbols")


TOP = 15


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="trace directory written by madtrace record/attach")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def summary_of(meta: dict) -> dict:
    summary = {key: meta.get(key) for key in SUMMARY_KEYS}
    summary["duration_s"] = round(meta["end_time"] - meta["start_time"], 6) \
        if "end_time" in meta and "start_time" in meta else None
    summary["modules"] = {m["name"]: {k: v for k, v in m.items() if k != "name"}
                          for m in meta.get("modules", [])}
    return summary


def print_human_summary(meta: dict, directory: str, out) -> None:
    s = summary_of(meta)
    command = " ".join(s["command"] or []) or f"pid {s['pid']}"
    if s["outcome"] == "snapshot":
        ending = "still running: a snapshot written by the REPL's save,"
    elif s["exit_signal"]:
        ending = f"killed by signal {s['exit_signal']}"
    elif s["exit_status"] is not None:
        ending = f"exit status {s['exit_status']}"
    else:
        ending = f"detached ({s['stop_reason']})"
    print(f"== madtrace summary of {directory}", file=out)
    print(f"   target   : {command}", file=out)
    label = "state" if s["outcome"] == "snapshot" else "ended"
    print(f"   {label:<9}: {ending} after {s['duration_s']:.3f} s", file=out)
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
    print(f"   dropped events: {s['dropped_events']}", file=out)


def run(args) -> int:
    meta = store.read_meta(args.directory)
    if args.json:
        json.dump(summary_of(meta), sys.stdout)
        sys.stdout.write("\n")
    else:
        print_human_summary(meta, args.directory, sys.stdout)
    return 0
