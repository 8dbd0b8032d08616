# SPDX-License-Identifier: GPL-2.0-or-later
"""A session leaves nothing behind, and a new session takes out what a
killed one left.

* tests/progs/pending: two threads sit inside traced functions (one patched
  at its call sites, one at its entry) when the session ends: detach gives
  those calls their real return address back and unmaps every madtrace
  mapping; the program then finishes with the output of an untraced run.
* The daemon is killed with SIGKILL mid-session: the target runs on, patched;
  a new daemon on the same PID says what it found, every patched function is
  byte for byte what its file holds again, nothing of madtrace stays mapped,
  and the target finishes correctly (its calls pending in the old
  trampolines return to their callers).
* A real server (python3 -m http.server on 127.0.0.1, a request every 20 ms):
  100 attach/instrument/detach cycles of libpython functions: every request
  answered, no madtrace mapping afterwards, VmRSS within 2 MiB of its start,
  VmSize within 1% (the figures printed).
Oracles: /proc/PID/maps, /proc/PID/status, the files the functions come
from, the programs' own output."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from madtrace.recording.recording import Recording, RecordOptions

from .test_daemon import daemon_log_tail, run, start_daemon, wait_gone
from .test_live_load import RequestLoop, python_function_spec, start_server
from .util import MADTRACE, ROOT, madtrace_maps, prog, read_line, start_ready

CYCLES = 100


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def function_bytes(pid: int, address: int, size: int) -> tuple[bytes, bytes]:
    """(the bytes in the process, the bytes of the file it maps) of a function."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.rstrip("\n").split(None, 5)      # a path may hold spaces
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end and len(fields) >= 6:
                offset, path = int(fields[2], 16), fields[5]
                break
        else:
            raise AssertionError(f"{address:#x} is not mapped in {pid}")
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(address)
        now = mem.read(size)
    with open(path, "rb") as image:
        image.seek(offset + address - start)
        return now, image.read(size)


def step(target: subprocess.Popen, n: int) -> None:
    """One line to tests/progs/pending: both threads return once and wait again."""
    target.stdin.write(b"go\n")
    target.stdin.flush()
    assert read_line(target, timeout=60) == f"step {n}\n".encode()


def daemon_line(runtime: str) -> list[str]:
    logs = [os.path.join(runtime, "madtrace", f) for f in os.listdir(os.path.join(runtime, "madtrace"))
            if f.endswith(".log")]
    return [line for path in logs for line in open(path).read().splitlines()]


@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_detach_returns_pending_calls_and_unmaps_everything(tmp_path, variant):
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    target = start_ready([prog("pending", variant)])
    try:
        daemon = start_daemon(runtime, target.pid, tmp_path / "t")
        result = run(runtime, "ctl", str(target.pid), "instrument", "wait_direct", "wait_entry",
                     "--json")
        assert result.returncode == 0, result.stderr
        methods = {p["function"]: p["method"] for p in json.loads(result.stdout)["patched"]}
        assert methods == {"wait_direct": "callsite", "wait_entry": "entry"}
        assert madtrace_maps(target.pid)
        step(target, 1)                     # both now wait inside calls made through trampolines
        calls = json.loads(run(runtime, "ctl", str(target.pid), "calls", "--json").stdout)
        assert calls == {"wait_direct": 1, "wait_entry": 1}
        assert run(runtime, "ctl", str(target.pid), "stop").returncode == 0
        wait_gone(daemon)
        assert madtrace_maps(target.pid) == []
        log = "\n".join(daemon_line(runtime))
        assert re.search(r"took \d+ mappings .* gave 2 pending calls their return address back", log), log
        step(target, 2)
        out, _ = target.communicate(b"", timeout=60)
    finally:
        target.kill()
    assert target.returncode == 0
    assert out == b"lines 2 direct 3 entry 3\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_leave_nothing(tmp_path, signum):
    """``madtrace attach`` ended by Ctrl-C or SIGTERM while calls are pending in
    trampolines: the same as a detach."""
    target = start_ready([prog("pending", "O2-nopie")])
    try:
        tracer = subprocess.Popen([*MADTRACE, "attach", str(target.pid), "-o", str(tmp_path / "t"),
                                   "-f", "wait_direct", "-f", "wait_entry"],
                                  stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT))
        line = tracer.stderr.readline().decode()
        assert "tracing 2 functions" in line, line
        step(target, 1)
        tracer.send_signal(signum)
        _, err = tracer.communicate(timeout=60)
        assert tracer.returncode == 0, err
        assert re.search(rb"took \d+ mappings .* gave 2 pending calls their return address back",
                         err), err
        assert madtrace_maps(target.pid) == []
        step(target, 2)
        out, _ = target.communicate(b"", timeout=60)
    finally:
        target.kill()
    assert target.returncode == 0
    assert out == b"lines 2 direct 3 entry 3\n"


def ring_pool_hooks(runtime: str, pid: int) -> int:
    """The C library's functions the daemon's ring pool hooked (fork, exec: 4 with
    glibc 2.34 or later), which a later session restores from the file too."""
    result = run(runtime, "ctl", str(pid), "status", "--json")
    assert result.returncode == 0, result.stderr
    pool = json.loads(result.stdout)["ring_pool"]
    assert pool["on"], pool
    return pool["hooks"]


def test_killed_daemon_leftovers_are_restored_from_the_files(tmp_path):
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    target = start_ready([prog("pending", "O2-pie")])
    try:
        daemon = start_daemon(runtime, target.pid, tmp_path / "t1")
        assert run(runtime, "ctl", str(target.pid), "instrument", "wait_direct",
                   "wait_entry").returncode == 0
        step(target, 1)
        with open(tmp_path / "t1" / "functions.json") as f:
            tables = json.load(f)
        functions, sites = tables["functions"], tables["sites"]
        hooks = ring_pool_hooks(runtime, target.pid)    # the C library's fork and exec
        os.kill(daemon, signal.SIGKILL)
        wait_gone(daemon)
        step(target, 2)                     # it runs on through the orphaned trampolines
        for site in sites:                  # still patched
            now, original = function_bytes(target.pid, site["address"], 5)
            assert now != original, site
        assert madtrace_maps(target.pid)
        result = run(runtime, "daemon", str(target.pid), "-o", str(tmp_path / "t2"))
        assert result.returncode == 0, result.stderr
        lines = result.stderr.decode().splitlines()
        assert re.match(r"madtrace: process \d+ still had what an earlier madtrace session left: "
                        rf"{len(sites) + hooks} patched sites \(in libc.so.6, pending-O2-pie\) "
                        r"restored from the files, (\d+) of its \1 mappings .* unmapped, 2 pending "
                        r"calls given their return address$", lines[0]), lines
        for fn in functions:
            now, original = function_bytes(target.pid, fn["address"], fn["size"])
            assert now == original, fn["name"]
        for site in sites:
            now, original = function_bytes(target.pid, site["address"], 5)
            assert now == original, site
        assert madtrace_maps(target.pid, attached=True) == []       # the old call page too
        assert run(runtime, "ctl", str(target.pid), "stop").returncode == 0
        wait_gone(int(re.search(r"daemon (\d+) traces", result.stderr.decode()).group(1)))
        assert madtrace_maps(target.pid) == []
        step(target, 3)
        out, _ = target.communicate(b"", timeout=60)
    finally:
        target.kill()
    assert target.returncode == 0
    assert out == b"lines 3 direct 4 entry 4\n"


def test_killed_daemon_on_a_server_under_load(tmp_path):
    """The same on python3 -m http.server, libpython functions patched at their
    entry and at call sites, requests all along."""
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    server, port = start_server(tmp_path)
    try:
        names = ["PyDict_New", "PyDict_SetItem", "PyDict_GetItemWithError", "insertdict"]
        specs = [python_function_spec(server.pid, name) for name in names]
        with RequestLoop(port) as loop:
            daemon = start_daemon(runtime, server.pid, tmp_path / "t1")
            result = run(runtime, "ctl", str(server.pid), "instrument", *specs, "--json")
            assert result.returncode == 0, result.stderr
            report = json.loads(result.stdout)
            assert {p["method"] for p in report["patched"]} == {"entry", "callsite"}
            answered = loop.answered
            while loop.answered < answered + 5:
                time.sleep(0.05)
            with open(tmp_path / "t1" / "functions.json") as f:
                functions = json.load(f)["functions"]
            sites = json.load(open(tmp_path / "t1" / "functions.json"))["sites"]
            hooks = ring_pool_hooks(runtime, server.pid)
            os.kill(daemon, signal.SIGKILL)
            wait_gone(daemon)
            answered = loop.answered
            while loop.answered < answered + 5:
                time.sleep(0.05)
            result = run(runtime, "daemon", str(server.pid), "-o", str(tmp_path / "t2"))
            assert result.returncode == 0, result.stderr
            line = result.stderr.decode().splitlines()[0]
            assert re.match(rf"madtrace: process {server.pid} still had what an earlier madtrace "
                            rf"session left: {len(sites) + hooks} patched sites \(in libc.so.6, "
                            r"libpython", line), line
            for fn in functions:
                now, original = function_bytes(server.pid, fn["address"], fn["size"])
                assert now == original, fn["name"]
            for site in sites:          # call sites lie in other functions
                now, original = function_bytes(server.pid, site["address"], 5)
                assert now == original, site
            assert madtrace_maps(server.pid, attached=True) == []
            assert run(runtime, "ctl", str(server.pid), "stop").returncode == 0
            answered = loop.answered
            while loop.answered < answered + 5:
                time.sleep(0.05)
        assert server.poll() is None
        assert loop.failures == [], loop.failures[:5]
        assert madtrace_maps(server.pid) == []
    finally:
        server.kill()
        server.wait()


def fill_stack_cache(port: int, threads: int = 6) -> None:
    """Six request threads alive at once (each request waits for the end of its
    headers): glibc keeps the stacks of exited threads for reuse, up to 40 MiB,
    so that VmSize no longer depends on how many requests happened to overlap."""
    conns = []
    for _ in range(threads):
        conn = socket.create_connection(("127.0.0.1", port), timeout=30)
        conn.sendall(b"GET / HTTP/1.0\r\n")
        conns.append(conn)
    time.sleep(0.2)
    for conn in conns:
        conn.sendall(b"\r\n")
        while conn.recv(65536):
            pass
        conn.close()


def quiet_figures(pid: int) -> tuple[int, int]:
    """(VmRSS, VmSize) in KiB while the server has no request thread (each
    request's thread has its own 8 MiB stack mapped while it runs)."""
    deadline = time.monotonic() + 60
    while status_kib(pid, "Threads") != 1:
        assert time.monotonic() < deadline, "the server keeps a request thread"
        time.sleep(0.01)
    return status_kib(pid, "VmRSS"), status_kib(pid, "VmSize")


def test_hundred_cycles_on_a_server_leave_nothing(tmp_path, capsys):
    server, port = start_server(tmp_path)
    try:
        specs = [python_function_spec(server.pid, name) for name in
                 ("PyDict_New", "PyDict_SetItem", "PyDict_GetItemWithError", "insertdict")]
        with RequestLoop(port) as warm_up:
            while warm_up.answered < 20:      # the server's own memory settles
                time.sleep(0.05)
        fill_stack_cache(port)
        rss, size = quiet_figures(server.pid)
        with RequestLoop(port) as loop:
            for cycle in range(CYCLES):
                recording = Recording(RecordOptions(output=str(tmp_path / f"t{cycle}"), quiet=True,
                                                    trace_functions=False, duration=0.05))
                recording.attach(server.pid)
                recording.add_functions(specs)
                answered = loop.answered
                assert recording.run() is None            # detached after --duration
                assert madtrace_maps(server.pid) == [], cycle
                while loop.answered <= answered:          # a request between the steps
                    time.sleep(0.01)
        rss_after, size_after = quiet_figures(server.pid)
        with open(tmp_path / f"t{CYCLES - 1}" / "meta.json") as f:
            meta = json.load(f)
        with capsys.disabled():
            print(f"\nhttp.server after {CYCLES} attach/instrument/detach cycles: VmRSS {rss} -> "
                  f"{rss_after} KiB, VmSize {size} -> {size_after} KiB, {loop.answered} requests "
                  f"answered, {len(loop.failures)} failed")
        assert sum(meta["calls"].values()) > 0
        assert loop.failures == [] and warm_up.failures == [], loop.failures[:5]
        assert server.poll() is None
        assert madtrace_maps(server.pid) == []
        assert abs(rss_after - rss) <= 2048
        assert abs(size_after - size) <= size / 100
    finally:
        server.kill()
        server.wait()


def test_killed_hybrid_sessions_are_cleaned_by_the_next(tmp_path):
    """A daemon tracing data with the hybrid engine, killed (SIGKILL) at a random
    point 0.2-1.5 s after it started (copying, tracing), 20 times on the same
    thread-per-request server under load: each next daemon takes the killed
    one's aliases, copies and hooks out (what a thread still runs in stays,
    said), traces, and the server serves all along, its answers right.  The
    last session ends normally.  Each kill lands while no request is under way:
    a kill during one can still take the server down (a known limit, measured
    by bench/bench_tracer_kill.py), which is not what is tested here."""
    from .test_live_transactions import Pinger, ask, work_sum
    import random
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    server = subprocess.Popen([prog("thread_server", "O2-pie")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    port = int(re.search(rb"port (\d+)", read_line(server)).group(1))
    pinger = Pinger(port).start()
    rng = random.Random(20)
    recovered = 0
    try:
        for cycle in range(21):
            out = tmp_path / f"t{cycle}"
            result = run(runtime, "daemon", str(server.pid), "--data", "-o", str(out))
            assert result.returncode == 0, (cycle, result.stderr.decode())
            recovered += b"still had what an earlier madtrace session left" in result.stderr
            daemon = int(re.search(rb"daemon (\d+) traces", result.stderr).group(1))
            time.sleep(rng.uniform(0.2, 1.5))
            n = rng.randrange(50)
            assert ask(port, f"{n}\n".encode()) == f"{work_sum(n)}\n".encode(), cycle
            if cycle < 20:
                pinger.pause()
                os.kill(daemon, signal.SIGKILL)
                wait_gone(daemon)
                pinger.resume()
            else:
                assert run(runtime, "ctl", str(server.pid), "stop").returncode == 0
            wait_gone(daemon)
            assert server.poll() is None, (f"the server died in cycle {cycle}",
                                           daemon_log_tail(runtime, server.pid))
            assert ask(port, b"9\n") == f"{work_sum(9)}\n".encode(), cycle
    finally:
        pinger.stop()
        server.stdin.close()
        server.wait(timeout=60)
    assert server.returncode == 0
    assert pinger.failures == [], pinger.failures[:5]
    assert recovered == 20
