# SPDX-License-Identifier: GPL-2.0-or-later
"""Output parity of two versions of madtrace's offline side.

A refactoring must not change a byte of what madtrace prints or writes.
This script records a set of example traces with one version (REF, e.g.
the commit before the change), then produces every offline output of each
trace (report of every kind as text, JSON, PNG and HTML, every export
format, SQL queries, summary, help texts, the errors of bad requests) with
REF and with the working tree, and compares them byte for byte: stdout,
stderr, exit status and every file written.

    python tests/output_parity.py --ref main [--work DIR] [--keep]

REF is any commit: its ``madtrace/`` is extracted with ``git archive`` into
DIR/ref and run with PYTHONPATH pointing at it (the compiled helpers of
build/ are shared: they must not differ between the two versions; with
``--own-native`` REF's native parts are built from its own sources into its
``madtrace/built``, where it finds them first, for a change of the C parts).  Exit
status 0 when every output is identical, 1 otherwise (the differing outputs
listed).  ``make parity REF=...`` runs it.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")

# name -> (record options, program and its arguments)
TRACES = {
    "demo": (["--data"], ["examples/demo"]),
    "demo-notime-nostore": (["--data", "--no-time", "--no-store"], ["examples/demo"]),
    "data_threads": (["--data"], ["tests/data_threads-O2-pie"]),
    "data_alloc": (["--data"], ["tests/data_alloc-O0-nopie"]),
    "data_blocks": (["--data"], ["tests/data_blocks-O0-pie"]),
    "data_cxx": (["--data"], ["tests/data_cxx-O2-pie"]),
    "data_numa": (["--data"], ["tests/data_numa-O0-pie"]),
    "data_globals-nofunc": (["--data", "--no-functions"], ["tests/data_globals-O0-nopie"]),
    "data_heap-select": (["--data", "-f", "chase", "-f", "grow"], ["tests/data_heap-O0-nopie"]),
    "calls_longjmp": ([], ["tests/calls_longjmp-O2-pie"]),
    "calls_tail": ([], ["tests/calls_tail-O2-nopie"]),
    "calls_threads": ([], ["tests/calls_threads-O0-pie"]),
    "calls_recursion-notime": (["--no-time"], ["tests/calls_recursion-O0-pie"]),
}

KINDS = ("calls", "segments", "heatmap", "alloc", "numa", "footprint", "source", "all")
PNG_KINDS = ("heatmap", "alloc", "footprint")
QUERIES = (
    "SELECT function, count(*) AS n, sum(accesses_self), sum(bytes_incl) FROM calls "
    "GROUP BY ALL ORDER BY n DESC, function",
    "SELECT region, kind, count(*) FROM accesses GROUP BY ALL ORDER BY ALL",
    "SELECT tid, pos, type, function, site, call_id, addr, size, instruction, data "
    "FROM events ORDER BY tid, pos LIMIT 200",
    "SELECT * FROM allocations ORDER BY id",
    "SELECT * FROM sites ORDER BY site",
    "SELECT * FROM records ORDER BY tid, pos LIMIT 50",
    "SELECT no_such_column FROM calls",
)


def run(root: str, args: list[str], cwd: str, name: str, out_dir: str, files=()) -> None:
    """Run madtrace (the version in ``root``) and keep stdout, stderr, status and files."""
    env = dict(os.environ, PYTHONPATH=root, MADTRACE_DEBUG="")
    env.pop("MADTRACE_DEBUG")
    result = subprocess.run([sys.executable, "-m", "madtrace.cli.main", *args], cwd=cwd, env=env,
                            capture_output=True, timeout=600)
    target = os.path.join(out_dir, name)
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "stdout"), "wb") as f:
        f.write(result.stdout)
    with open(os.path.join(target, "stderr"), "wb") as f:
        f.write(result.stderr)
    with open(os.path.join(target, "status"), "w") as f:
        f.write(f"{result.returncode}\n")
    for path in files:
        full = os.path.join(cwd, path)
        if os.path.isdir(full):
            shutil.copytree(full, os.path.join(target, os.path.basename(path)))
        elif os.path.exists(full):
            shutil.copy(full, os.path.join(target, os.path.basename(path)))


def record(root: str, traces: str) -> None:
    os.makedirs(traces, exist_ok=True)
    for name, (options, command) in TRACES.items():
        command = [os.path.join(BUILD, command[0]), *command[1:]]
        run(root, ["record", "-q", "--force", "-o", os.path.join(traces, name), *options, "--",
                   *command], traces, f"record-{name}", os.path.join(traces, ".record"))


def outputs(root: str, traces: str, out_dir: str, work: str) -> None:
    """Every offline output of every trace in ``traces`` into ``out_dir``.  The
    traces are copied to ``work`` first (a query may build a store; outputs
    name the directory): both versions read identical inputs at one path."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(traces, work, ignore=shutil.ignore_patterns(".record"))
    for o in ("-h", "--version"):
        run(root, [o], work, f"help{o}", out_dir)
    for command in ("report", "export", "query", "summary", "record"):
        run(root, [command, "--help"], work, f"help-{command}", out_dir)
    run(root, ["report", "nothing"], work, "error-report-missing", out_dir)
    run(root, ["export", "nothing", "--format", "madt"], work, "error-export-missing", out_dir)
    for name in sorted(os.listdir(work)):
        if name.startswith("."):
            continue
        d = name
        for kind in KINDS:
            run(root, ["report", d, "--kind", kind], work, f"{name}/report-{kind}", out_dir)
            run(root, ["report", d, "--kind", kind, "--json"], work,
                f"{name}/report-{kind}-json", out_dir)
        run(root, ["report", d, "--kind", "calls", "--top", "3", "--depth", "2"], work,
            f"{name}/report-calls-top3", out_dir)
        run(root, ["report", d, "--kind", "segments", "--top", "2", "--depth", "1"], work,
            f"{name}/report-segments-top2", out_dir)
        for kind in PNG_KINDS:
            png = f"{name}-{kind}.png"
            run(root, ["report", d, "--kind", kind, "--png", png], work,
                f"{name}/png-{kind}", out_dir, [png])
        html = f"{name}.html"
        run(root, ["report", d, "--html", html], work, f"{name}/html", out_dir, [html])
        run(root, ["report", d, "--html", html, "--kind", "calls", "--force"], work,
            f"{name}/html-calls", out_dir, [html])
        run(root, ["report", d, "--html", html, "--kind", "heatmap", "--force"], work,
            f"{name}/html-heatmap", out_dir, [html])
        for fmt, extra in (("madt", []), ("madt", ["--raw"]), ("lackey", []), ("chrome", []),
                           ("chrome", ["--max-events", "50"])):
            run(root, ["export", d, "--format", fmt, *extra], work,
                f"{name}/export-{fmt}{''.join(extra)}", out_dir)
        for sql_index, sql in enumerate(QUERIES):
            run(root, ["query", d, sql], work, f"{name}/query-{sql_index}", out_dir)
            run(root, ["query", d, sql, "--json"], work, f"{name}/query-{sql_index}-json", out_dir)
        run(root, ["summary", d], work, f"{name}/summary", out_dir)
        run(root, ["summary", d, "--json"], work, f"{name}/summary-json", out_dir)
        run(root, ["export", d, "--format", "parquet", "-o", f"{name}.parquet"], work,
            f"{name}/export-parquet", out_dir, [f"{name}.parquet"])
        # the store (built by the first query when it was recorded with --no-store)
        run(root, ["query", d, "SELECT 1"], work, f"{name}/query-store-built", out_dir,
            [os.path.join(d, "store")])
        for table in ("records", "calls", "accesses", "allocations", "sites", "block_events"):
            run(root, ["query", d, f"SELECT * FROM {table} ORDER BY ALL", "--json"], work,
                f"{name}/store-{table}", out_dir)


def compare(a: str, b: str) -> list[str]:
    differ = []

    def walk(cmp: filecmp.dircmp, prefix: str) -> None:
        for n in cmp.left_only + cmp.right_only:
            differ.append(f"{prefix}{n}: only in one")
        for n, sub in cmp.subdirs.items():
            walk(sub, f"{prefix}{n}/")

    walk(filecmp.dircmp(a, b, ignore=[]), "")
    # every file's bytes
    for dirpath, _dirs, names in os.walk(a):
        for n in names:
            left = os.path.join(dirpath, n)
            right = os.path.join(b, os.path.relpath(left, a))
            if os.path.exists(right) and not filecmp.cmp(left, right, shallow=False):
                rel = os.path.relpath(left, a)
                if rel in differ or (n.endswith(".parquet") and same_rows(left, right)):
                    continue
                differ.append(rel)
    return sorted(set(differ))


def same_rows(left: str, right: str) -> bool:
    """Parquet files with the same schema and the same rows in any order (DuckDB's
    COPY writes rows in the order its threads finish)."""
    import pyarrow.parquet as pq
    a, b = pq.read_table(left), pq.read_table(right)
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    return sorted(map(repr, a.to_pylist())) == sorted(map(repr, b.to_pylist()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the commit to compare with (e.g. main)")
    parser.add_argument("--work", help="working directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--traces", help="use these traces (recorded earlier) instead of "
                        "recording new ones with REF")
    parser.add_argument("--own-native", action="store_true",
                        help="build REF's native parts from its own sources (the C changed)")
    parser.add_argument("--reuse", action="store_true", help="keep the traces and the reference's "
                        "outputs already in --work (only the working tree's are made again)")
    args = parser.parse_args()
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="madtrace-parity-"))
    if os.path.commonpath([work, ROOT]) == ROOT:
        # ref/build links back to build/: inside the repository it makes a cycle that
        # setuptools' package discovery follows (pip install -e then never ends)
        parser.error("--work must be outside the repository")
    os.makedirs(work, exist_ok=True)
    ref = os.path.join(work, "ref")
    shutil.rmtree(ref, ignore_errors=True)
    os.makedirs(ref)
    parts = ["madtrace", "injector"] if args.own_native else ["madtrace"]
    archive = subprocess.run(["git", "archive", args.ref, *parts], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", ref], input=archive, check=True)
    if args.own_native:
        subprocess.run([sys.executable, os.path.join(ref, "injector", "build_native.py"),
                        os.path.join(ref, "madtrace", "built")], check=True, cwd=ref,
                       env=dict(os.environ, PYTHONPATH=ref))
    os.symlink(BUILD, os.path.join(ref, "build"))
    traces = os.path.abspath(args.traces) if args.traces else os.path.join(work, "traces")
    reuse = args.reuse and os.path.isdir(os.path.join(work, "out-ref"))
    if not args.traces and not reuse:
        print(f"recording {len(TRACES)} traces with {args.ref} in {traces}", flush=True)
        record(ref, traces)
    if not reuse:
        print("outputs of the reference", flush=True)
        shutil.rmtree(os.path.join(work, "out-ref"), ignore_errors=True)
        outputs(ref, traces, os.path.join(work, "out-ref"), os.path.join(work, "run"))
    print("outputs of the working tree", flush=True)
    shutil.rmtree(os.path.join(work, "out-new"), ignore_errors=True)
    outputs(ROOT, traces, os.path.join(work, "out-new"), os.path.join(work, "run"))
    differ = compare(os.path.join(work, "out-ref"), os.path.join(work, "out-new"))
    total = sum(len(files) for _, _, files in os.walk(os.path.join(work, "out-ref")))
    for d in differ:
        print(f"differs: {d}")
    print(f"{total - len(differ)} of {total} outputs identical ({work})")
    if not args.keep and not args.work and not differ:
        shutil.rmtree(work)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
