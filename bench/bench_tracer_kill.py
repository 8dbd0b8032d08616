"""How often a SIGKILL of madtrace takes down a busy program it traces data of.

One new ``python3 -m http.server`` per kill, a request loop on it, ``madtrace
attach --data --no-functions``, SIGKILL 0.4-2 s after the start (madtrace is
then aliasing, copying and protecting), then: did the server die (and of
what), or does it still answer?  Trees given as arguments are measured in
alternating loops of KILLS kills (the spread between loops is large on a
shared VM, so alternate).  Usage:

    python bench/bench_tracer_kill.py [TREE ...]     (default: this tree)

environment: KILLS (per loop, default 12), LOOPS (default 2).
"""

from __future__ import annotations

import collections
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def answer(port: int):
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=3).status
    except Exception as exc:      # a refused or timed-out request is an outcome here
        return type(exc).__name__


def one_kill(tree: str, scratch: str) -> str:
    port = random.randint(20000, 30000)
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    try:
        time.sleep(1)
        threading.Thread(target=lambda: [answer(port) for _ in iter(stop.is_set, True)],
                         daemon=True).start()
        tracer = subprocess.Popen([sys.executable, "-m", "madtrace.cli.main", "attach", "-q", "--data",
                                   "--no-functions", "--duration", "5", "-o",
                                   os.path.join(scratch, f"t{port}"), str(server.pid)],
                                  env=dict(os.environ, PYTHONPATH=tree), cwd=tree,   # -m: cwd first
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.uniform(0.4, 2.0))
        tracer.kill()
        tracer.wait()
        time.sleep(0.5)
        if server.poll() is not None:
            return f"died ({server.returncode})"
        return "answers" if answer(port) == 200 else "does not answer"
    finally:
        stop.set()
        server.kill()
        server.wait()


def main() -> None:
    import tempfile
    trees = sys.argv[1:] or [ROOT]
    kills, loops = int(os.environ.get("KILLS", 12)), int(os.environ.get("LOOPS", 2))
    totals = {tree: collections.Counter() for tree in trees}
    with tempfile.TemporaryDirectory() as scratch:
        for loop in range(loops):
            for tree in trees:
                outcomes = collections.Counter(one_kill(tree, scratch) for _ in range(kills))
                totals[tree] += outcomes
                print(f"loop {loop + 1}, {tree}: {dict(outcomes)}", flush=True)
    print(f"\n{'tree':40} {'kills':>6} {'servers lost':>13}")
    for tree, outcomes in totals.items():
        lost = sum(n for outcome, n in outcomes.items() if outcome != "answers")
        print(f"{tree:40} {sum(outcomes.values()):6} {lost:13}")


if __name__ == "__main__":
    main()
