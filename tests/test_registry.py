# SPDX-License-Identifier: GPL-2.0-or-later
"""Adding a report kind or an export format is one file.

A copy of the package gets one new module in madtrace/kinds/ (a real small
kind: per-thread access counts) and one in madtrace/exports/ (the accesses
as CSV); nothing else is edited.  Then `report --help` and `export --help`
list them, `report --kind threads` (text and JSON) and `export --format csv`
give the counts that numpy computes from the raw access files (the oracle),
`report all` includes the new kind, and the existing kinds' outputs are the
same as without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from madtrace.trace.record_files import ACCESS_RECORDS
from madtrace.trace.format import KIND_LOAD

from .util import ROOT, madtrace, prog

THREADS_KIND = '''
"""report --kind threads: loads, stores and bytes per thread."""
import numpy as np
from . import Kind


def _compute(directory, args):
    from ..analysis.trace_input import require_accesses
    from ..trace.format import KIND_LOAD
    from ..trace.record_files import ACCESS_RECORDS
    require_accesses(directory, "threads")
    rows = {}
    for tid, path in ACCESS_RECORDS.files(directory):
        loads = stores = size = 0
        for chunk in ACCESS_RECORDS.chunks(path, 1 << 20):
            load = chunk["kind"] == KIND_LOAD
            loads += int(load.sum())
            stores += int((~load).sum())
            size += int(chunk["size"].astype(np.int64).sum())
        rows[tid] = {"loads": loads, "stores": stores, "bytes": size}
    return rows


def _text(rows, top, args, out):
    for tid, r in sorted(rows.items())[:top]:
        print(f"thread {tid}: {r['loads']} loads, {r['stores']} stores, {r['bytes']} bytes",
              file=out)


KIND = Kind(name="threads", help="accesses per thread", order=7, needs=("accesses",),
            compute=_compute, text=_text,
            json=lambda rows, args: {str(t): r for t, r in sorted(rows.items())},
            all_order=99)
'''

CSV_EXPORT = '''
"""export --format csv: one line per access (tid,addr,size,kind)."""
from . import Export, write_lines


def _lines(directory):
    from ..trace.format import KIND_LOAD
    from ..trace.record_files import ACCESS_RECORDS
    yield "tid,addr,size,kind"
    for tid, path in ACCESS_RECORDS.files(directory):
        for chunk in ACCESS_RECORDS.chunks(path, 1 << 16):
            for a in chunk.tolist():
                yield f"{tid},{a[3]},{a[5]},{'L' if a[6] == KIND_LOAD else 'S'}"


EXPORT = Export(name="csv", help="its accesses as CSV", order=4,
                write=lambda args: write_lines(args, _lines(args.directory)))
'''


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    """A copy of madtrace with one new kind file and one new export file."""
    root = tmp_path_factory.mktemp("extended")
    shutil.copytree(
        os.path.join(ROOT, "madtrace"), root / "madtrace", ignore=shutil.ignore_patterns("__pycache__")
    )
    os.symlink(os.path.join(ROOT, "build"), root / "build")
    (root / "madtrace" / "kinds" / "threads.py").write_text(THREADS_KIND)
    (root / "madtrace" / "exports" / "csv.py").write_text(CSV_EXPORT)
    return str(root)


def run(root: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "madtrace.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env=dict(os.environ, PYTHONPATH=root),
    )


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("registry") / "t")
    r = madtrace("record", "-q", "--data", "-o", directory, "--", prog("data_threads", "O0-pie"))
    assert r.returncode == 0, r.stderr
    return directory


def oracle(directory: str) -> dict[str, dict]:
    out = {}
    for tid, path in ACCESS_RECORDS.files(directory):
        rows = ACCESS_RECORDS.read(path)
        out[str(tid)] = {
            "loads": int((rows["kind"] == KIND_LOAD).sum()),
            "stores": int((rows["kind"] != KIND_LOAD).sum()),
            "bytes": int(rows["size"].astype(np.int64).sum()),
        }
    return out


def test_a_new_kind_is_one_file(extended, trace, tmp_path):
    expected = oracle(trace)
    assert len(expected) >= 2  # data_threads: several threads made accesses
    help_text = " ".join(run(extended, "report", "--help").stdout.split())
    assert "threads (accesses per thread)" in help_text and "threads," in help_text
    r = run(extended, "report", trace, "--kind", "threads", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == expected
    text = run(extended, "report", trace, "--kind", "threads").stdout
    for tid, counts in expected.items():
        assert f"thread {tid}: {counts['loads']} loads, {counts['stores']} stores" in text
    every = json.loads(run(extended, "report", trace, "--kind", "all", "--json").stdout)
    normal = json.loads(madtrace("report", trace, "--kind", "all", "--json").stdout)
    assert list(every["reports"]) == list(normal["reports"]) + ["threads"]
    assert {"calls", "heatmap", "alloc", "source", "footprint"} <= set(normal["reports"])
    assert every["reports"]["threads"] == expected
    # the other kinds are untouched by the new one
    for kind in ("calls", "heatmap", "alloc"):
        assert (
            run(extended, "report", trace, "--kind", kind).stdout
            == madtrace("report", trace, "--kind", kind).stdout.decode()
        )
    # a kind without a picture says so, with the list from the registry
    r = run(extended, "report", trace, "--kind", "threads", "--png", str(tmp_path / "x.png"))
    assert r.returncode == 2 and "--png draws heatmap, alloc, footprint" in r.stderr


def test_a_new_export_format_is_one_file(extended, trace, tmp_path):
    assert "its accesses as CSV" in " ".join(run(extended, "export", "--help").stdout.split())
    out = str(tmp_path / "a.csv")
    r = run(extended, "export", trace, "--format", "csv", "-o", out)
    assert r.returncode == 0, r.stderr
    with open(out) as f:
        lines = f.read().splitlines()
    assert lines[0] == "tid,addr,size,kind"
    expected = oracle(trace)
    assert len(lines) - 1 == sum(c["loads"] + c["stores"] for c in expected.values())
    r = run(extended, "export", trace, "--format", "csv", "-o", out)
    assert r.returncode != 0 and "already exists" in r.stderr  # never over a file
