# SPDX-License-Identifier: GPL-2.0-or-later
"""Function tracing benchmark: overhead per traced call, in ns.

tests/progs/bench_calls.c (O2, PIE) calls the tiny function leaf() N times,
each through a wrapper, with a real call.  Each configuration runs at two
sizes N1 < N2 and the per-call cost is (t(N2) - t(N1)) / (N2 - N1), so that
start-up (exec, symbol loading, patching, attach, final drain and write-out
at fixed cost) cancels:

* native: no tracer;
* uftrace: ``uftrace record --no-libcall -P leaf -d DIR`` (dynamic patching
  of leaf's entry, no -pg build; --no-libcall so that it traces leaf only);
* madtrace: ``madtrace record -q -f leaf -o DIR``, with timestamps and with
  ``--no-time``.

Before timing, each tracer's trace is checked once: it must hold exactly N1
calls of leaf (and, for madtrace, no dropped events), and the program's output
must be the untraced one.  The per-call figures include everything the tracer
does for a call, including writing the records out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from common import ROOT, best_of, prog, table

NATIVE_SIZES = (2_000_000, 20_000_000)
TRACED_SIZES = (1_000_000, 10_000_000)
REPEAT = 5
MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
ENV = dict(os.environ, PYTHONPATH=ROOT)


class Unavailable(Exception):
    pass


def run(argv: list) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, env=ENV, timeout=600)


def native_cmd(binary, n, out):
    return [binary, str(n)]


def uftrace_cmd(binary, n, out):
    return ["uftrace", "record", "--no-libcall", "-P", "leaf", "-d", out, binary, str(n)]


def madtrace_cmd(extra):
    def cmd(binary, n, out):
        return [*MADTRACE, "record", "-q", *extra, "-o", out, "-f", "leaf", "--", binary, str(n)]
    return cmd


def uftrace_check(out: str, n: int) -> None:
    r = run(["uftrace", "report", "-d", out, "--no-pager", "-F", "leaf"])
    for line in r.stdout.decode().splitlines():
        fields = line.split()
        if fields and fields[-1] == "leaf":
            calls = int(fields[-2])
            if calls != n:
                raise Unavailable(f"uftrace recorded {calls} calls of leaf, not {n}")
            return
    raise Unavailable(f"no leaf in uftrace's report: {r.stdout!r} {r.stderr!r}")


def madtrace_check(out: str, n: int) -> None:
    r = run([*MADTRACE, "summary", out, "--json"])
    if r.returncode != 0:
        raise Unavailable(r.stderr.decode().strip())
    s = json.loads(r.stdout)
    if s["calls"].get("leaf") != n or s["dropped_events"] != 0:
        raise Unavailable(f"madtrace recorded {s['calls'].get('leaf')} calls of leaf "
                          f"({s['dropped_events']} dropped), not {n}")


def measure(name, cmd, sizes, check, binary, expected, tmp):
    """(t(N1), t(N2)) in seconds, medians of REPEAT runs."""
    counter = [0]

    def once(n):
        counter[0] += 1
        out = os.path.join(tmp, f"{name.replace(' ', '_')}.{counter[0]}")
        r = run(cmd(binary, n, out))
        shutil.rmtree(out, ignore_errors=True)
        return r

    # correctness first, once, untimed
    out = os.path.join(tmp, f"{name.replace(' ', '_')}.check")
    r = run(cmd(binary, sizes[0], out))
    if r.returncode != 0:
        raise Unavailable(r.stderr.decode().strip().splitlines()[-1] if r.stderr else
                          f"exit status {r.returncode}")
    if r.stdout != expected[sizes[0]]:
        raise Unavailable(f"output differs from the untraced run: {r.stdout!r}")
    if check:
        check(out, sizes[0])
    shutil.rmtree(out, ignore_errors=True)
    return tuple(best_of(lambda: once(n), REPEAT) for n in sizes)


def main() -> int:
    if not shutil.which("uftrace"):
        print("uftrace is not installed (make deps installs it)", file=sys.stderr)
    binary = prog("bench_calls", "O2-pie")
    expected = {n: subprocess.run([binary, str(n)], capture_output=True, check=True).stdout
                for n in set(NATIVE_SIZES + TRACED_SIZES)}
    configs = [
        ("native", native_cmd, NATIVE_SIZES, None),
        ("uftrace", uftrace_cmd, TRACED_SIZES, uftrace_check),
        ("madtrace", madtrace_cmd([]), TRACED_SIZES, madtrace_check),
        ("madtrace --no-time", madtrace_cmd(["--no-time"]), TRACED_SIZES, madtrace_check),
    ]
    per_call: dict = {}
    rows = []
    notes = []
    with tempfile.TemporaryDirectory(prefix="madtrace-bench-") as tmp:
        for name, cmd, sizes, check in configs:
            if name == "uftrace" and not shutil.which("uftrace"):
                notes.append(f"{name}: not installed")
                continue
            try:
                t1, t2 = measure(name, cmd, sizes, check, binary, expected, tmp)
            except (Unavailable, subprocess.TimeoutExpired) as e:
                rows.append((name, "-", "-", "-", "failed"))
                notes.append(f"{name}: {e}")
                continue
            ns = (t2 - t1) / (sizes[1] - sizes[0]) * 1e9
            per_call[name] = ns
            rows.append((name, f"{sizes[0]}/{sizes[1]}", f"{t1 * 1e3:.1f}", f"{t2 * 1e3:.1f}",
                         f"{ns:.1f}"))
    native = per_call.get("native", 0.0)
    print(table(f"per-call cost of tracing leaf(), ns (median of {REPEAT}, differenced)",
                rows, ("tracer", "N1/N2", "t(N1) ms", "t(N2) ms", "ns/call")))
    for note in notes:
        print(f"  {note}")
    ratio_rows = []
    for name in ("uftrace", "madtrace", "madtrace --no-time"):
        if name in per_call:
            ratio_rows.append((name, f"{per_call[name] - native:.1f}",
                               f"{per_call['uftrace'] / per_call[name]:.2f}x"
                               if "uftrace" in per_call else "-"))
    print(table("overhead per call over native, ns, and uftrace / this", ratio_rows,
                ("tracer", "overhead ns", "uftrace/this")))
    return 1 if notes else 0


if __name__ == "__main__":
    sys.exit(main())
