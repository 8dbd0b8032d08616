# SPDX-License-Identifier: GPL-2.0-or-later
"""Shared fixtures of the madtrace tests.

* ``built_programs`` (session, autouse): runs ``make programs`` when a test
  program in ``build/tests`` is missing or older than its ``tests/progs/*.c``.
* ``prog`` fixture: ``util.prog``, the path of ``build/tests/NAME-VARIANT``
  (paths, variants and plain helpers live in ``tests/util.py``).
* ``launch`` fixture: ``launch(name, variant, args=(), env=None)`` (or
  ``launch(path)``) starts the program with stdin/stdout pipes, waits until
  it prints a line ``ready`` and returns the ``Popen``; the lines printed
  before ``ready`` are in ``proc.ready_lines`` and, for ``KEY VALUE`` lines,
  parsed into the dict ``proc.info``.  Every launched process still alive at
  teardown is killed (close ``proc.stdin`` in the test for a normal exit).
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path

import pytest

from .util import ALL_VARIANTS, BUILD, PROGS_SRC, ROOT, prog

READY_TIMEOUT = 20.0  # generous safety net only; never a measured timing


def _programs_stale() -> bool:
    for src in [*Path(PROGS_SRC).glob("*.c"), *Path(PROGS_SRC).glob("*.cc")]:
        for v in ALL_VARIANTS:
            b = Path(BUILD) / f"{src.stem}-{v}"
            if not b.exists() or b.stat().st_mtime < src.stat().st_mtime:
                return True
    return False


@pytest.fixture(scope="session", autouse=True)
def symbol_cache(tmp_path_factory):
    """The tests' own symbol cache (MADTRACE_CACHE_DIR), never the user's."""
    os.environ["MADTRACE_CACHE_DIR"] = str(tmp_path_factory.mktemp("symbol-cache"))
    return os.environ["MADTRACE_CACHE_DIR"]


@pytest.fixture(scope="session", autouse=True)
def no_resident_on_demand():
    """No resident process started on demand by the tests' daemons (each test has
    its own runtime directory: one would stay for minutes per test); the tests of
    that start set MADTRACE_RESIDENT_IDLE themselves."""
    os.environ["MADTRACE_RESIDENT_IDLE"] = "0"


@pytest.fixture(scope="session", autouse=True)
def built_programs():
    """Make sure every tests/progs/*.c is compiled in all variants."""
    if _programs_stale():
        # -o .venv/.installed: never the venv (a worktree sharing it would point
        # its editable install at itself: every madtrace command then ran that tree)
        r = subprocess.run(["make", "-s", "-o", ".venv/.installed", "programs"], cwd=ROOT,
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"`make programs` failed:\n{r.stdout}\n{r.stderr}")
    return BUILD


@pytest.fixture(name="prog")
def prog_fixture():
    return prog


def _wait_ready(proc: subprocess.Popen, timeout: float) -> list[str]:
    lines: list[str] = []
    buf = b""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no 'ready' line from {proc.args!r}; got {lines!r}")
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            raise RuntimeError(f"{proc.args!r} exited before 'ready' "
                               f"(status {proc.wait()}); output {lines!r}")
        buf += chunk
        while b"\n" in buf:
            raw, buf = buf.split(b"\n", 1)
            line = raw.decode(errors="replace").rstrip("\r")
            if line == "ready":
                if buf:
                    proc.pending_output = buf
                return lines
            lines.append(line)


@pytest.fixture
def launch():
    procs: list[subprocess.Popen] = []

    def _launch(name_or_path: str, variant: str | None = None, args=(), env=None,
                timeout: float = READY_TIMEOUT) -> subprocess.Popen:
        path = prog(name_or_path, variant) if variant is not None else name_or_path
        proc = subprocess.Popen([path, *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env)
        procs.append(proc)
        proc.pending_output = b""
        proc.ready_lines = _wait_ready(proc, timeout)
        info = {}
        for line in proc.ready_lines:
            parts = line.split(None, 1)
            if len(parts) == 2:
                info[parts[0]] = parts[1]
        proc.info = info
        return proc

    yield _launch
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        for f in (p.stdin, p.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass
