# SPDX-License-Identifier: GPL-2.0-or-later
"""The flight recorder (--flight SIZE): what it costs and what it holds.

cost    per call and per access, a flight recording against an ordinary one
        (the default options), whole runs side by side, interleaved, --runs
        runs, the median:
          calls:  tests/progs/bench_calls N (-f leaf): (t - native) / N
          data:   tests/progs/flight_requests R -1 with --data: (t - native) /
                  the accesses of the whole recording
server  the `python3` on PATH running `-m http.server` on 127.0.0.1, a client
        asking for a page in a loop; `madtrace daemon PID --flight SIZE
        --data` for --seconds: every 0.5 s the daemon's RSS, the memory the
        flight recorder's files hold (/dev/shm) and the bytes of DIR on disk
        (nothing until a snapshot); then `ctl PID snapshot`, its size, the
        detach, /proc/PID/maps
slow    the same server with a handler that sleeps 0.2 s on /slow; the daemon
        traces _PyEval_EvalFrameDefault with --trigger-slow ...:150ms; after
        a warm-up, one request to /slow: the snapshot it writes and whether
        its last completed call is the slow one

python bench/bench_flight.py [--runs 5] [--seconds 60] [--size 32M] [--parts cost,server,slow]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from common import ROOT, prog, table

MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
CALLS = 20_000_000  # bench_calls N
REQUESTS = 20_000  # flight_requests R
WARM_UP = 10.0  # s of requests before the slow one (the first ones are slow, traced)
SLOW_SERVER = """
import http.server, time
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slow":
            time.sleep(0.2)
        return super().do_GET()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print("port", server.server_address[1], flush=True)
server.serve_forever()
"""


def timed_run(command: list[str], env: dict) -> tuple[float, float]:
    """(wall s of the whole command, the program's own loop in s: its stderr line
    ``loop N ns/call`` (bench_calls) or ``loop N ns`` (flight_requests))."""
    started = time.perf_counter()
    done = subprocess.run(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=dict(os.environ, **env),
        text=True,
    )
    took = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    line = [x for x in done.stderr.splitlines() if x.startswith("loop ")][-1].split()
    loop = float(line[1]) * (CALLS if line[2] == "ns/call" else 1) / 1e9
    return took, loop


def accesses_of(directory: str) -> int:
    with open(os.path.join(directory, "meta.json")) as f:
        return sum(c["L"] + c["S"] for c in json.load(f)["accesses"].values())


def cost(runs: int, size: str) -> str:
    """Per event: (the program's own loop traced - untraced) / events; whole runs
    too (the flight recording's include writing its end snapshot)."""
    configs = {
        "calls (-f leaf)": ([prog("bench_calls"), str(CALLS)], ["-f", "leaf"], {"BENCH_CALLS_LOOP": "1"}),
        "accesses (--data)": (
            [prog("flight_requests"), str(REQUESTS), "-1"],
            ["--data"],
            {"FLIGHT_REQUESTS_TIME": "1"},
        ),
    }
    rows = []
    work = tempfile.mkdtemp(prefix="madtrace-flight-bench-")
    try:
        for name, (argv, options, env) in configs.items():
            runs_of: dict[str, list[tuple[float, float]]] = {"native": [], "ordinary": [], "flight": []}
            events = CALLS
            for _ in range(runs):
                runs_of["native"].append(timed_run(argv, env))
                out = os.path.join(work, "t")
                runs_of["ordinary"].append(
                    timed_run([*MADTRACE, "record", "-q", *options, "-o", out, "--", *argv], env)
                )
                if "--data" in options:
                    events = accesses_of(out)
                shutil.rmtree(out)
                folder = os.path.join(work, "f")
                runs_of["flight"].append(
                    timed_run(
                        [*MADTRACE, "record", "-q", "--flight", size, *options, "-o", folder, "--", *argv],
                        env,
                    )
                )
                shutil.rmtree(folder)
            median = {
                k: (statistics.median(w for w, _ in v), statistics.median(lp for _, lp in v))
                for k, v in runs_of.items()
            }
            native_loop = median["native"][1]
            rows.append(
                (
                    name,
                    f"{events:,}",
                    *(f"{median[k][0]:.2f} s" for k in runs_of),
                    *(f"{(median[k][1] - native_loop) / events * 1e9:.1f}" for k in ("ordinary", "flight")),
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return table(
        f"Cost, median of {runs} interleaved runs (flight: --flight {size}); ns per "
        f"event over native, from the program's own loop",
        rows,
        (
            "program",
            "events",
            "native run",
            "ordinary run",
            "flight run",
            "ns/event ordinary",
            "ns/event flight",
        ),
    )


def start_server(script: str | None, directory: str) -> tuple[subprocess.Popen, int]:
    argv = (
        ["python3", "-c", script]
        if script
        else [
            "python3",
            "-u",
            "-c",
            (
                "import http.server, functools\n"
                "h = functools.partial(http.server.SimpleHTTPRequestHandler, directory='.')\n"
                "http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None\n"
                "s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), h)\n"
                "print('port', s.server_address[1], flush=True)\n"
                "s.serve_forever()\n"
            ),
        ]
    )
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, cwd=directory)
    line = server.stdout.readline().split()
    return server, int(line[1])


def daemon_pid(stderr: str) -> int:
    return int(stderr.split("daemon ", 1)[1].split()[0])


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def held_mb(pid: int) -> float:
    total = 0
    for scratch in glob.glob(f"/dev/shm/madtrace-flight.{pid}.*"):
        for folder, _dirs, names in os.walk(scratch):
            for name in names:
                try:
                    total += os.stat(os.path.join(folder, name)).st_blocks * 512
                except OSError:
                    pass
    return total / 1048576


def disk_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(path) for n in ns) / 1048576


def server(seconds: float, size: str) -> str:
    work = tempfile.mkdtemp(prefix="madtrace-flight-bench-")
    with open(os.path.join(work, "index.html"), "w") as f:
        f.write("<p>hello</p>\n" * 100)
    srv, port = start_server(None, work)
    folder = os.path.join(work, "flight")
    requests = [0]
    stop = threading.Event()

    def client():
        while not stop.is_set():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=30) as r:
                r.read()
            requests[0] += 1

    try:
        started = subprocess.run(
            [*MADTRACE, "daemon", str(srv.pid), "--flight", size, "--data", "-o", folder],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        daemon = daemon_pid(started.stderr)
        thread = threading.Thread(target=client)
        thread.start()
        samples = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.5)
            samples.append((rss_mb(daemon), held_mb(daemon), disk_mb(folder)))
        snap = subprocess.run(
            [*MADTRACE, "ctl", str(srv.pid), "snapshot", "--json"], capture_output=True, text=True, cwd=ROOT
        )
        stop.set()
        thread.join()
        written = json.loads(snap.stdout)
        subprocess.run([*MADTRACE, "ctl", str(srv.pid), "stop"], capture_output=True, cwd=ROOT)
        time.sleep(1)
        with open(f"/proc/{srv.pid}/maps") as f:
            left = sum("madtrace" in line for line in f)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=30) as r:
            answers = r.status == 200
        rows = [
            ("requests served while traced", f"{requests[0]:,}"),
            (
                "daemon RSS, max (median)",
                f"{max(s[0] for s in samples):.0f} MB ({statistics.median(s[0] for s in samples):.0f} MB)",
            ),
            (
                f"flight recorder's files in /dev/shm, max (bound {size})",
                f"{max(s[1] for s in samples):.1f} MB",
            ),
            ("DIR on disk before the snapshot, max", f"{max(s[2] for s in samples):.3f} MB"),
            (
                "the snapshot",
                f"{disk_mb(written['directory']):.1f} MB, the last "
                f"{written['flight']['seconds']:.2f} s, {written['accesses']:,} accesses",
            ),
            ("madtrace mappings left after the detach", str(left)),
            ("the server answers after the detach", str(answers)),
        ]
        return table(
            f"A live http.server, --flight {size} --data for {seconds:g} s", rows, ("measure", "value")
        )
    finally:
        srv.kill()
        shutil.rmtree(work, ignore_errors=True)


def slow(size: str) -> str:
    work = tempfile.mkdtemp(prefix="madtrace-flight-bench-")
    for name in ("index.html", "slow"):
        with open(os.path.join(work, name), "w") as f:
            f.write("hello\n")
    srv, port = start_server(SLOW_SERVER, work)
    folder = os.path.join(work, "flight")
    try:
        subprocess.run(
            [
                *MADTRACE,
                "daemon",
                str(srv.pid),
                "--flight",
                size,
                "--data",
                "-f",
                "_PyEval_EvalFrameDefault",
                "--trigger-slow",
                "_PyEval_EvalFrameDefault:150ms",
                "-o",
                folder,
            ],
            capture_output=True,
            check=True,
            cwd=ROOT,
        )
        warm = time.monotonic() + WARM_UP  # discovery's first faults
        while time.monotonic() < warm:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read()
        time.sleep(1.5)
        before = len(glob.glob(os.path.join(folder, "snapshot.*")))
        asked = time.perf_counter()
        urllib.request.urlopen(f"http://127.0.0.1:{port}/slow", timeout=30).read()
        deadline = time.monotonic() + 30
        while len(glob.glob(os.path.join(folder, "snapshot.*", "meta.json"))) <= before:
            if time.monotonic() > deadline:
                return "slow: no snapshot within 30 s of the slow request\n"
            time.sleep(0.05)
        latency = time.perf_counter() - asked
        newest = os.path.join(folder, f"snapshot.{before + 1}")
        with open(os.path.join(newest, "meta.json")) as f:
            flight = json.load(f)["flight"]
        sys.path.insert(0, ROOT)
        import madtrace as api

        last = (
            api.open(newest, progress=False)
            .sql(
                "SELECT function, duration_ns FROM calls WHERE fate = 'completed' "
                "ORDER BY end_tsc DESC LIMIT 1"
            )
            .fetchall()[0]
        )
        subprocess.run([*MADTRACE, "ctl", str(srv.pid), "stop"], capture_output=True, cwd=ROOT)
        rows = [
            ("snapshots of the warm-up (the first requests, slow while traced)", str(before)),
            ("the slow request's snapshot: trigger", flight["trigger"]),
            ("its last completed call", f"{last[0]}, {last[1] / 1e6:.1f} ms"),
            ("from the request to the snapshot on disk", f"{latency:.2f} s"),
        ]
        return table("A handler made slow on purpose (--trigger-slow)", rows, ("measure", "value"))
    finally:
        srv.kill()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--size", default="32M")
    parser.add_argument("--parts", default="cost,server,slow")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if "cost" in parts:
        print(cost(args.runs, "64M"))
    if "server" in parts:
        print(server(args.seconds, args.size))
    if "slow" in parts:
        print(slow(args.size))


if __name__ == "__main__":
    main()
