"""Soak: a daemon attached to a live python3 -m http.server (127.0.0.1)
for 10 minutes (MADTRACE_SOAK_SECONDS to change it), instrumenting and
restoring libpython functions every few seconds, while a bounded request loop
(one GET every 20 ms) runs.  Reports the requests answered and failed, the
calls counted, the drops, the tracer's peak RSS, the target's RSS and VmSize
before and after, and what madtrace left mapped in the target (nothing
expected)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from common import ROOT, table

MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
FUNCTIONS = ("PyDict_New", "PyDict_SetItem", "PyDict_GetItemWithError", "insertdict",
             "PyObject_GetAttr", "PyUnicode_FromString")
SECONDS = float(os.environ.get("MADTRACE_SOAK_SECONDS", 600))
PERIOD = 3.0            # seconds between instrument and restore


def status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmSize", "VmHWM", "Threads"):
                out[key] = int(value.split()[0])
    return out


def fill_stack_cache(port: int, threads: int = 6) -> None:
    """Six request threads at once: glibc keeps exited threads' stacks (up to
    40 MiB), so that VmSize does not depend on how many requests overlapped."""
    conns = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(threads)]
    for conn in conns:
        conn.sendall(b"GET / HTTP/1.0\r\n")
    time.sleep(0.2)
    for conn in conns:
        conn.sendall(b"\r\n")
        while conn.recv(65536):
            pass
        conn.close()


def quiet(pid: int) -> dict[str, int]:
    """The server's figures while it has no request thread."""
    deadline = time.monotonic() + 30
    while status(pid)["Threads"] != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    return status(pid)


class Requests(threading.Thread):
    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/"
        self.answered = 0
        self.failed = 0
        self.latencies: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=30) as reply:
                    reply.read()
                self.answered += 1
                self.latencies.append(time.perf_counter() - t0)
            except Exception:
                self.failed += 1
            self.stop.wait(0.02)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=ROOT, XDG_RUNTIME_DIR=os.path.join(tmp, "run"))
        os.mkdir(env["XDG_RUNTIME_DIR"], 0o700)
        server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind",
                                   "127.0.0.1"], cwd=tmp, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL)
        try:
            port = int(re.search(rb"port (\d+)", server.stdout.readline()).group(1))
            with open(f"/proc/{server.pid}/maps") as f:
                lib = re.search(r"/(libpython[^/\s]*\.so[^/\s]*)$", f.read(), re.M)
            specs = [f"{lib.group(1)}:{n}" if lib else n for n in FUNCTIONS]
            requests = Requests(port)
            requests.start()
            time.sleep(1)
            fill_stack_cache(port)
            before = quiet(server.pid)

            def ctl(*words):
                return subprocess.run([*MADTRACE, "ctl", str(server.pid), *words],
                                      capture_output=True, env=env, timeout=120)

            started = subprocess.run([*MADTRACE, "daemon", str(server.pid), "-o",
                                      os.path.join(tmp, "t")], capture_output=True, env=env)
            daemon = int(re.search(rb"daemon (\d+) traces", started.stderr).group(1))
            cycles = failures = 0
            end = time.monotonic() + SECONDS
            peak = 0
            while time.monotonic() < end:
                failures += ctl("instrument", *specs).returncode != 0
                time.sleep(PERIOD / 2)
                failures += ctl("restore", "all").returncode != 0
                time.sleep(PERIOD / 2)
                cycles += 1
                peak = max(peak, status(daemon)["VmHWM"])
            calls = json.loads(ctl("calls", "--json").stdout or b"{}")
            state = json.loads(ctl("status", "--json").stdout or b"{}")
            peak = max(peak, status(daemon)["VmHWM"])
            failures += ctl("stop").returncode != 0
            while os.path.exists(f"/proc/{daemon}"):
                time.sleep(0.05)
            time.sleep(1)
            requests.stop.set()
            requests.join()
            after = quiet(server.pid)
            with open(f"/proc/{server.pid}/maps") as f:
                left = [line for line in f if "/memfd:madtrace" in line]
            alive = server.poll() is None
        finally:
            server.kill()
            server.wait()
    latencies = sorted(requests.latencies)
    median = latencies[len(latencies) // 2] * 1000 if latencies else 0
    rows = [("duration", f"{SECONDS:.0f} s, {cycles} instrument/restore cycles"),
            ("requests answered / failed", f"{requests.answered} / {requests.failed}"),
            ("request latency, median", f"{median:.2f} ms"),
            ("calls counted", sum(calls.values())),
            ("dropped events", state.get("dropped_events")),
            ("ctl failures", failures),
            ("tracer peak RSS", f"{peak / 1024:.1f} MiB"),
            ("target VmRSS before / after", f"{before['VmRSS']} / {after['VmRSS']} KiB"),
            ("target VmSize before / after", f"{before['VmSize']} / {after['VmSize']} KiB"),
            ("madtrace mappings left", len(left)),
            ("server alive", alive)]
    print(table("daemon soak on python3 -m http.server", rows, ("what", "value")))
    ok = alive and not left and not failures and not requests.failed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
