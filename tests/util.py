"""Helpers shared by the tests: paths of the compiled test programs and
starting a program that announces "ready"."""

from __future__ import annotations

import os
import select
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGS_SRC = os.path.join(ROOT, "tests", "progs")
BUILD = os.path.join(ROOT, "build", "tests")
VARIANTS = ("O0-pie", "O0-nopie", "O2-pie", "O2-nopie")   # what tests run at
ALL_VARIANTS = VARIANTS + ("O2-pie-stripped",)             # what the Makefile builds
MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]


def prog(name: str, variant: str = "O0-pie") -> str:
    """Path of the compiled test program build/tests/NAME-VARIANT (built by the
    session fixture in conftest.py)."""
    path = os.path.join(BUILD, f"{name}-{variant}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is not built (run `make programs`)")
    return path


def read_line(proc: subprocess.Popen, timeout: float = 30) -> bytes:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError("program printed nothing")
    return proc.stdout.readline()


def start_ready(argv: list[str]) -> subprocess.Popen:
    """Start a program with pipes and wait until it prints 'ready'."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = read_line(proc)
    if line != b"ready\n":
        proc.kill()
        raise AssertionError(f"expected 'ready', got {line!r}")
    return proc


def finish_live(proc: subprocess.Popen, timeout: float = 60) -> bytes:
    """End a running tests/progs/live_calls: close its stdin (it stops after
    its current round) and return what it printed after 'ready'."""
    out, _ = proc.communicate(timeout=timeout)
    return out


def check_live_output(path: str, out: bytes) -> int:
    """``out`` (what live_calls printed after 'ready') must be byte-identical
    to an untraced run of the same program for the same number of iterations
    (stdin at EOF: it does exactly that many, without waiting).  Returns it."""
    import re
    match = re.search(rb"^iterations=(\d+) ", out, re.M)
    assert match, f"no iterations line in {out!r}"
    iterations = match.group(1).decode()
    reference = subprocess.run([path, iterations], stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=120)
    assert reference.returncode == 0
    assert b"ready\n" + out == reference.stdout, (out, reference.stdout)
    return int(iterations)


def madtrace(*args: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run(MADTRACE + list(args), capture_output=True, timeout=kw.pop("timeout", 120),
                          env=env, **kw)


def wait_in_syscall(pid: int, number: int, timeout: float = 10) -> None:
    """Wait until the process's main thread blocks in syscall ``number``."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
        if fields and fields[0] == str(number):
            return
        time.sleep(0.005)
    raise TimeoutError(f"process {pid} never blocked in syscall {number}")


def run_untraced(argv: list[str], **kw) -> subprocess.CompletedProcess:
    """The program run without madtrace: the oracle for output and exit status."""
    return subprocess.run(argv, capture_output=True, timeout=kw.pop("timeout", 120), **kw)


def summary_json(directory) -> dict:
    """``madtrace summary DIR --json``, parsed."""
    import json
    result = madtrace("summary", str(directory), "--json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def report_json(directory, *args: str) -> dict:
    """``madtrace report DIR --json ARGS``, parsed (call trees thousands of
    levels deep need a higher recursion limit to parse)."""
    import json
    result = madtrace("report", str(directory), "--json", *args)
    assert result.returncode == 0, result.stderr
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20000))
    try:
        return json.loads(result.stdout)
    finally:
        sys.setrecursionlimit(limit)


def one_line_error(result: subprocess.CompletedProcess, code: int, needle: str) -> None:
    """madtrace failed with exit ``code`` and exactly one line 'madtrace: ...needle...'."""
    err = result.stderr.decode()
    assert result.returncode == code, (result.returncode, err)
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("madtrace: ") and needle in lines[0], lines[0]


def madtrace_maps(pid: int, attached: bool = False) -> list[str]:
    """The lines of /proc/PID/maps that are madtrace's mappings (memfds madtrace-*);
    ``attached``: but for the call page a live session keeps for its remote
    calls (process/call_page.py)."""
    with open(f"/proc/{pid}/maps") as f:
        return [line.strip() for line in f if "/memfd:madtrace" in line
                and not (attached and "/memfd:madtrace-calls" in line)]


def large_anonymous_maps(pid: int, at_least: int = 1 << 32) -> list[str]:
    """Anonymous mappings of ``at_least`` bytes or more (the hybrid engine's page bitmap,
    4 GiB, becomes zeros at detach and must go with the copies that read it)."""
    found = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if end - start >= at_least and (len(fields) < 6 or not fields[5].strip()):
                found.append(line.strip())
    return found


def start_data_tracing(args: list) -> subprocess.Popen:
    """``madtrace ARGS`` (a recording with --data) started, once it says it is
    tracing data accesses (its stdout and stderr are pipes)."""
    import pytest
    tracer = subprocess.Popen(MADTRACE + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT))
    for line in tracer.stderr:
        if b"tracing data accesses" in line:
            return tracer
    tracer.kill()
    tracer.wait()
    pytest.fail("madtrace never started data tracing")


def detach_after(tracer: subprocess.Popen, pause: float) -> tuple[bytes, bytes]:
    """SIGTERM to a recording ``pause`` seconds from now (a detach): its (stdout, stderr)."""
    import signal
    import time
    try:
        time.sleep(pause)
        tracer.send_signal(signal.SIGTERM)
        return tracer.communicate(timeout=300)
    finally:
        if tracer.poll() is None:
            tracer.kill()

