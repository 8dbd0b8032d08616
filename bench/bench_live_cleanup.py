"""What live data tracing leaves in a server, detached or killed.

On ``python3 -m http.server`` (127.0.0.1) under a request loop, for each tree
given (default: this one), alternating:

* detach: ``daemon PID``, ``ctl PID instrument 'PyDict_*'``, ``ctl PID trace
  data on``, 1 s, ``ctl PID stop``; counted: the cycles after which a
  madtrace mapping stays in /proc/PID/maps, and whether ``ctl stop`` said so;
* reattach: ``daemon PID --data``, SIGKILL 0.2-3 s later, then the next
  daemon on the same server: counted, the attaches that succeed (a killed
  hybrid session's process is cleaned, not refused) and the servers a kill
  took down (each replaced by a new one); a last session ends normally, and
  the mappings left after it are counted.

The request loop's failures (a request that got no answer within 5 s) are
counted too.  Writes bench/results/live_cleanup.md.  Usage:

    python bench/bench_live_cleanup.py [TREE ...]

environment: CYCLES (per measure and tree, default 20).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from common import ROOT, side_by_side


class Requests:
    def __init__(self, port: int):
        self.port, self.answered, self.failed = port, 0, 0
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=5).read()
                self.answered += 1
            except Exception:        # noqa: BLE001 - counted
                self.failed += 1
            self.stop.wait(0.02)

    def answers(self) -> bool:
        before, deadline = self.answered, time.monotonic() + 20
        while self.answered < before + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.answered >= before + 2


def madtrace(tree: str, runtime: str, *args: str) -> subprocess.CompletedProcess:
    """madtrace of ``tree`` (run from there: ``-m`` puts the working directory first)."""
    return subprocess.run([sys.executable, "-m", "madtrace.cli.main", *args], capture_output=True,
                          timeout=300, cwd=tree,
                          env=dict(os.environ, PYTHONPATH=tree, XDG_RUNTIME_DIR=runtime))


@contextlib.contextmanager
def serving(scratch: str, out: dict):
    """A new server under a request loop: (its process, the loop, a runtime
    directory for the daemons); the loop's failures go into ``out``."""
    port = random.randint(20000, 30000)
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    requests = Requests(port)
    try:
        yield proc, requests, tempfile.mkdtemp(dir=scratch)
    finally:
        requests.stop.set()
        out["request failures"] = out.get("request failures", 0) + requests.failed
        proc.kill()
        proc.wait()


def mappings(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as f:
        return sum("/memfd:madtrace" in line for line in f)


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 120
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split()[2] == "Z":
                return
        time.sleep(0.05)


def daemon_pid(result) -> int:
    return int(re.search(rb"daemon (\d+) traces", result.stderr).group(1))


def detach_cycles(tree: str, scratch: str, cycles: int) -> dict:
    out = {"cycles": 0, "left": 0, "said": 0, "server lost": 0}
    spec = "libpython3.11.so.1.0:PyDict_*"
    with serving(scratch, out) as (proc, requests, runtime):
        for cycle in range(cycles):
            trace = os.path.join(scratch, f"d{cycle}")
            started = madtrace(tree, runtime, "daemon", str(proc.pid), "-o", trace)
            if started.returncode:
                break
            madtrace(tree, runtime, "ctl", str(proc.pid), "instrument", spec)
            madtrace(tree, runtime, "ctl", str(proc.pid), "trace", "data", "on")
            time.sleep(1)
            stopped = madtrace(tree, runtime, "ctl", str(proc.pid), "stop")
            wait_gone(daemon_pid(started))
            subprocess.run(["rm", "-rf", trace])
            out["cycles"] += 1
            if proc.poll() is not None or not requests.answers():
                out["server lost"] += 1
                break
            if mappings(proc.pid):
                out["left"] += 1
                said = (stopped.stdout + stopped.stderr).decode()
                out["said"] += "left" in said
                out.setdefault("first why", said.strip()[-200:])
    return out


def reattach_cycles(tree: str, scratch: str, cycles: int) -> dict:
    """Kills until ``cycles``; a server a kill took down is counted and replaced."""
    out = {"kills": 0, "reattached": 0, "refused": 0, "servers lost": 0}
    while out["kills"] < cycles and not out["refused"]:
        with serving(scratch, out) as (proc, requests, runtime):
            _kill_and_reattach(tree, scratch, proc, requests, runtime, cycles, out)
    return out


def _kill_and_reattach(tree, scratch, proc, requests, runtime, cycles, out) -> None:
    first = True
    while True:
        trace = os.path.join(scratch, f"k{out['kills']}")
        started = madtrace(tree, runtime, "daemon", str(proc.pid), "--data", "-o", trace)
        if started.returncode:
            out["refused"] += 1
            out["refusal"] = started.stderr.decode().strip()[-200:]
            return
        out["reattached"] += not first
        first = False
        daemon = daemon_pid(started)
        if out["kills"] == cycles:           # the last one ends normally
            time.sleep(1)
            madtrace(tree, runtime, "ctl", str(proc.pid), "stop")
            wait_gone(daemon)
            out["left after the last"] = mappings(proc.pid)
            return
        time.sleep(random.uniform(0.2, 3.0))
        try:
            os.kill(daemon, 9)
        except ProcessLookupError:
            pass
        wait_gone(daemon)
        subprocess.run(["rm", "-rf", trace])
        out["kills"] += 1
        if proc.poll() is not None or not requests.answers():
            out["servers lost"] += 1
            return


def main() -> None:
    trees = sys.argv[1:] or [ROOT]
    cycles = int(os.environ.get("CYCLES", 20))
    with tempfile.TemporaryDirectory() as scratch:
        side_by_side(
            "Live data tracing: what stays in a server",
            f"http.server under a request loop, {cycles} cycles per measure and tree "
            "(bench/bench_live_cleanup.py).",
            {measure.__name__.replace("_", " "): functools.partial(measure, scratch=scratch,
                                                                   cycles=cycles)
             for measure in (detach_cycles, reattach_cycles)},
            trees, "live_cleanup.md")


if __name__ == "__main__":
    main()
