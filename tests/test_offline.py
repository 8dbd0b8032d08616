# SPDX-License-Identifier: GPL-2.0-or-later
"""The offline side stands apart from the tracer.

A trace recorded here is read by every offline command (summary, report of
every kind and format, query, export of every format) in an interpreter
where importing the tracer's stack fails: python-ptrace, capstone and lief
raise ImportError, as on a laptop or a cluster node that only has numpy,
pyarrow and duckdb.  Oracle: the same commands in a normal interpreter; the
outputs must be byte-identical, and no module of process/, arch/, target/,
rings/, calls/, data/, recording/, live/ or daemon/ may have been imported.  The import-linter
contracts (.importlinter, `make check`) forbid such imports statically; this
test proves that nothing loads them at run time either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .util import ROOT, madtrace, prog

BLOCKED = ("ptrace", "capstone", "lief")
TRACER = (
    "madtrace.process",
    "madtrace.arch",
    "madtrace.target",
    "madtrace.rings",
    "madtrace.calls",
    "madtrace.data",
    "madtrace.recording",
    "madtrace.live",
    "madtrace.daemon",
)

# runs madtrace's CLI once per argv list, in one interpreter, with BLOCKED unimportable;
# prints one JSON object: per command its exit status, stdout and stderr, then the
# modules that were imported
RUNNER = r"""
import contextlib, importlib.abc, io, json, sys
BLOCKED = %r
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed on this machine (test_offline)")
        return None
if BLOCKED:
    sys.meta_path.insert(0, Block())
from madtrace.cli.main import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
    results.append({"argv": argv, "status": status, "stdout": out.getvalue(),
                    "stderr": err.getvalue()})
print(json.dumps({"results": results, "modules": sorted(sys.modules)}))
"""


def run_offline(commands: list[list[str]], blocked: tuple[str, ...]) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run(
        [sys.executable, "-c", RUNNER % (blocked,), json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("offline") / "t")
    r = madtrace("record", "-q", "--data", "-o", directory, "--", prog("data_alloc", "O0-nopie"))
    assert r.returncode == 0, r.stderr
    return directory


def test_blocked_imports_really_fail():
    """The blocker works: importing capstone in the runner's interpreter fails."""
    code = (
        "import sys, importlib.abc\n"
        + RUNNER.split("from madtrace.cli.main")[0] % (BLOCKED,)
        + "\ntry:\n    import capstone\nexcept ImportError as e:\n    print('blocked:', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "blocked: capstone is not installed" in r.stdout, (r.stdout, r.stderr)


def test_offline_commands_without_the_tracer(trace, tmp_path):
    out = str(tmp_path / "out")
    os.mkdir(out)
    commands = [["summary", trace], ["summary", trace, "--json"]]
    for kind in ("calls", "segments", "heatmap", "alloc", "footprint", "source", "all"):
        commands.append(["report", trace, "--kind", kind])
        if kind != "segments":  # a text listing only
            commands.append(["report", trace, "--kind", kind, "--json"])
    commands += [
        ["report", trace, "--html", os.path.join(out, "report.html")],
        ["report", trace, "--kind", "heatmap", "--png", os.path.join(out, "heatmap.png")],
        ["query", trace, "SELECT function, count(*) AS n FROM calls GROUP BY 1 ORDER BY 1"],
        ["query", trace, "SELECT count(*) FROM accesses"],
        ["export", trace, "--format", "madt"],
        ["export", trace, "--format", "lackey"],
        ["export", trace, "--format", "chrome", "-o", os.path.join(out, "trace.json")],
        ["export", trace, "--format", "parquet", "-o", os.path.join(out, "parquet")],
    ]
    offline = run_offline(commands, BLOCKED)
    loaded = [m for m in offline["modules"] if m.split(".")[0] in BLOCKED or m.startswith(TRACER)]
    assert loaded == [], f"the offline side imported the tracer's stack: {loaded}"
    for result in offline["results"]:
        assert result["status"] == 0, result
        assert (
            result["stdout"]
            or result["argv"][0] == "export"
            or "--html" in result["argv"]
            or "--png" in result["argv"]
        ), result
    for name in ("report.html", "heatmap.png", "trace.json", "parquet/calls.parquet"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name

    # the oracle: the same commands with everything importable, into fresh files
    normal_out = str(tmp_path / "normal")
    os.mkdir(normal_out)
    normal = run_offline([[a.replace(out, normal_out) for a in argv] for argv in commands], ())
    for a, b in zip(offline["results"], normal["results"]):
        assert (a["status"], a["stdout"]) == (b["status"], b["stdout"]), a["argv"]
    for name in ("report.html", "trace.json"):
        with open(os.path.join(out, name), "rb") as f1, open(os.path.join(normal_out, name), "rb") as f2:
            assert f1.read() == f2.read(), name
