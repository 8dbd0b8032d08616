# SPDX-License-Identifier: GPL-2.0-or-later
"""Outputs that cannot be written, and stores that cannot be read: one line and
a defined exit code each (23: an output cannot be written; 18: a trace that
cannot be read), never 70 ("internal error") nor a traceback.

A read-only file system and a full one are real tmpfs mounts in a mount
namespace of the test's own (unshare), so nothing outside is touched."""

from __future__ import annotations

import os
import random
import shlex
import shutil
import subprocess

import pytest

from .util import MADTRACE, ROOT, madtrace, one_line_error, prog

OUTPUT_ERROR, CORRUPT = 23, 18


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace") / "t"
    result = madtrace("record", "-q", "--data", "-o", str(out), "--", prog("data_heap", "O0-pie"))
    assert result.returncode == 0, result.stderr
    return out


def in_namespace(script: str) -> subprocess.CompletedProcess:
    """``script`` (sh) in a new mount namespace with a tmpfs on /mnt, /mnt/ro a
    read-only tmpfs and /mnt/full a tmpfs of 64 KiB."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("unshare (util-linux) is needed for the read-only and full file systems")
    flags = ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]
    setup = ("mount -t tmpfs -o size=8m tmpfs /mnt && mkdir -p /mnt/ro /mnt/full && "
             "mount -t tmpfs -o size=1m,ro tmpfs /mnt/ro && mount -t tmpfs -o size=64k tmpfs /mnt/full")
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([unshare, *flags, "sh", "-c", f"{setup} && {script}"], capture_output=True,
                          timeout=300, env=env)


def madtrace_line(*args: str) -> str:
    return " ".join(shlex.quote(a) for a in [*MADTRACE, *args])


@pytest.mark.parametrize("args,where", [
    (("record", "-q", "-o", "/mnt/ro/t", "--", "/bin/true"), "/mnt/ro/t: Read-only file system"),
    (("record", "-q", "-o", "/proc/nodir/t", "--", "/bin/true"), "No such file or directory"),
    (("record", "-q", "-o", "/mnt/afile/t", "--", "/bin/true"), "/mnt/afile/t: Not a directory"),
    (("export", "{trace}", "--format", "madt", "-o", "/mnt/ro/x.txt"), "Read-only file system"),
    (("export", "{trace}", "--format", "lackey", "-o", "/mnt/full/x.txt"), "No space left on device"),
    (("export", "{trace}", "--format", "chrome", "-o", "/mnt/afile/x.json"), "Not a directory"),
    (("export", "{trace}", "--format", "parquet", "-o", "/mnt/ro/pq"), "Read-only file system"),
    (("report", "{trace}", "--kind", "heatmap", "--png", "/mnt/ro/x.png"), "Read-only file system"),
    (("report", "{trace}", "--html", "/mnt/full/nodir/x.html"), "no such directory /mnt/full/nodir"),
    (("record", "-q", "--data", "-o", "/mnt/full/t", "--", "{bench}"), "No space left on device"),
])
def test_unwritable_output_is_one_line_and_exit_23(trace, args, where):
    copy = "/mnt/trace"
    args = [a.format(trace=copy, bench=prog("bench_data_memory", "O2-pie")) for a in args]
    result = in_namespace(f"cp -r {shlex.quote(str(trace))} {copy} && touch /mnt/afile && "
                          f"{madtrace_line(*args)} >/dev/null")
    err = result.stderr.decode()
    assert result.returncode == OUTPUT_ERROR, (result.returncode, err)
    assert "Traceback" not in err and "internal error" not in err
    lines = [line for line in err.splitlines() if line.startswith("madtrace: cannot write")]
    assert len(lines) == 1 and where in lines[0], err


def test_corrupt_store_is_rebuilt_from_the_trace_files(trace, tmp_path):
    copy = tmp_path / "t"
    shutil.copytree(trace, copy)
    expected = madtrace("query", str(copy), "SELECT count(*), sum(addr) FROM accesses", "--json")
    assert expected.returncode == 0, expected.stderr
    parquet = sorted(p for p in (copy / "store").rglob("*.parquet"))
    assert parquet
    rng = random.Random(7)
    for path in parquet[:3]:
        path.write_bytes(bytes(rng.randrange(256) for _ in range(path.stat().st_size)))
    result = madtrace("query", str(copy), "SELECT count(*), sum(addr) FROM accesses", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected.stdout
    assert b"is corrupt" in result.stderr and b"rebuilding it" in result.stderr


def test_corrupt_store_without_trace_files_is_exit_18(trace, tmp_path):
    copy = tmp_path / "t"
    shutil.copytree(trace, copy)
    assert madtrace("query", str(copy), "SELECT 1").returncode == 0     # the store built
    shutil.rmtree(copy / "data")
    shutil.rmtree(copy / "calls", ignore_errors=True)
    for path in (copy / "store").rglob("*.parquet"):
        path.write_bytes(b"garbage")
    one_line_error(madtrace("query", str(copy), "SELECT count(*) FROM accesses"), CORRUPT,
                   "the trace files to rebuild it from are gone")
