"""Discovery once per binary (data/hybrid/discovery_cache.py): a run lays out
the functions earlier runs relocated before the program goes on, so that they
do not fault first.

Oracles: the cold run itself (every instruction's loads and stores, in the
whole process, the same warm and cold), valgrind lackey (the warm run, per
instruction of the executable), the program's own output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from .test_data import _ranges_from_stderr, compare_with_lackey, madtrace_accesses
from .util import MADTRACE, ROOT, madtrace, prog

HYBRID = ["--data-engine", "hybrid"]


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """An empty cache of madtrace's for this test only (the first run is cold)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("MADTRACE_CACHE_DIR", str(folder))
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", "hybrid")
    return folder


def rewriter(meta: dict) -> dict:
    return meta["data_tracing"]["paths"]["rewriter"]


@pytest.mark.parametrize("program, args", [("data_tail_jumps", ("3000",)),
                                           ("data_kernels", ("list", "3000"))])
def test_a_warm_run_lays_out_what_the_cold_run_learnt(tmp_path, own_cache, program, args):
    """The second run relocates before the program goes on every function the
    first relocated: its threads are moved into copies at a fault a fifth as
    often or less (what is left in these small programs: a few functions whose
    entry cannot take a jump, still entered through their original code), and every instruction of the process
    records the same loads and stores as in the cold run; the warm run equals
    lackey per instruction."""
    argv = [prog(program, "O2-nopie"), *args]
    cold, cold_meta, cold_out = madtrace_accesses(tmp_path / "cold", argv, HYBRID)
    assert "functions laid out before their first fault" not in rewriter(cold_meta)
    got = compare_with_lackey(tmp_path / "warm", program, "O2-nopie", _ranges_from_stderr,
                              args=args, options=HYBRID)
    assert got
    warm_meta = json.loads((tmp_path / "warm" / "t" / "meta.json").read_text())
    warm = warm_meta["accesses"]
    assert warm == cold
    before, after = rewriter(cold_meta), rewriter(warm_meta)
    assert after["functions laid out before their first fault"] == before["functions_relocated"]
    moves = lambda r: r.get("moved", 0) + r.get("moved_by_fault_loop", 0)   # noqa: E731
    assert moves(before) >= 20 and moves(after) * 5 <= moves(before), (before, after)


def test_a_library_is_laid_out_with_what_runs_of_the_same_program_learnt(tmp_path, own_cache):
    """The C library's list is per program: a first run of another program on it
    lays out nothing (what runs of the first touched in it is not its own), and
    gets the same accesses as without a cache; the first program's next run
    lays out its own.  `cache list` names the program of each list."""
    a = [prog("data_kernels", "O2-nopie"), "list", "3000"]
    b = [prog("data_tail_jumps", "O2-nopie"), "3000"]
    _, a_meta, _ = madtrace_accesses(tmp_path / "a1", a, HYBRID)
    lists = [name for name in os.listdir(own_cache) if name.endswith(".mtd")]
    assert lists, "the first run kept no list"
    b_cold, b_meta, _ = madtrace_accesses(tmp_path / "b1", b, HYBRID)
    assert "functions laid out before their first fault" not in rewriter(b_meta)
    shutil.rmtree(own_cache)
    b_alone, _, _ = madtrace_accesses(tmp_path / "b0", b, HYBRID)
    assert b_cold == b_alone
    madtrace_accesses(tmp_path / "a0", a, HYBRID)          # its list again, cold
    _, a_warm, _ = madtrace_accesses(tmp_path / "a2", a, HYBRID)
    assert rewriter(a_warm)["functions laid out before their first fault"] == \
        rewriter(a_meta)["functions_relocated"]
    listing = madtrace("cache", "list").stdout.decode()
    assert f"(runs of {os.path.realpath(a[0])})" in listing, listing


def test_a_rebuilt_binary_is_not_given_the_old_copies(tmp_path, own_cache):
    """The list is kept per binary by its identity (build-id and size): the same
    path rebuilt from other source gets a list of its own, the old one is not
    read for it, and the rebuilt program runs and is traced right."""
    source = tmp_path / "p.c"
    exe = tmp_path / "p"
    for version in (1, 2):
        source.write_text(
            "#include <stdio.h>\nlong g[64];\n"
            f"__attribute__((noinline)) long touch(long i) {{ g[i & 63] += i * {version}; "
            "return g[i & 63]; }\n"
            "int main(void) { long s = 0; for (long i = 0; i < 5000; i++) s += touch(i);\n"
            "printf(\"%ld\\n\", s); return 0; }\n")
        subprocess.run(["gcc", "-O2", "-no-pie", "-o", str(exe), str(source)], check=True)
        native = subprocess.run([str(exe)], capture_output=True, timeout=60).stdout
        for run in ("cold", "warm"):
            accesses, meta, out = madtrace_accesses(tmp_path / f"v{version}{run}", [str(exe)],
                                                    HYBRID)
            assert out == native
            touch = {k: v for k, v in accesses.items() if k.startswith("touch+")}
            assert sum(c["L"] for c in touch.values()) == 5000, touch
    listing = madtrace("cache", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    lists = [e for e in json.loads(listing.stdout)["relocated_functions"]
             if e.get("binary", "").endswith(os.sep + "p")]
    assert len(lists) == 2, lists            # one per build of p


def test_warm_start_can_be_turned_off(tmp_path, own_cache, monkeypatch):
    """MADTRACE_WARM_START=0: a run discovers everything again (the comparison)."""
    argv = [prog("data_tail_jumps", "O2-nopie"), "300"]
    madtrace_accesses(tmp_path / "a", argv, HYBRID)
    monkeypatch.setenv("MADTRACE_WARM_START", "0")
    _, meta, _ = madtrace_accesses(tmp_path / "b", argv, HYBRID)
    assert "functions laid out before their first fault" not in rewriter(meta)
    assert rewriter(meta)["moved"] >= 3


def test_cache_clear_removes_the_lists(tmp_path, own_cache):
    madtrace_accesses(tmp_path / "a", [prog("data_tail_jumps", "O2-nopie"), "300"], HYBRID)
    assert any(name.endswith(".mtd") for name in os.listdir(own_cache))
    assert madtrace("cache", "clear").returncode == 0
    assert not any(name.endswith(".mtd") for name in os.listdir(own_cache))
    shutil.rmtree(own_cache, ignore_errors=True)


# run as a child subreaper: the program a killed madtrace leaves is reparented to it, and
# its exit status is known (0 and the native output, or it was never started)
KILL_ONE = """
import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)              # PR_SET_CHILD_SUBREAPER
delay, out_path, program, command = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
with open(out_path, "wb") as out:
    tracer = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE)
    # ``delay`` counts from the program's exec (it is madtrace's child then): the set-up
    # and the warm start come next, while the program waits at its entry point
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{tracer.pid}/task/{tracer.pid}/children") as f:
                children = f.read().split()
            if any(os.readlink(f"/proc/{c}/exe") == program for c in children):
                break
        except OSError:
            pass
        time.sleep(0.002)
    time.sleep(delay)
    os.kill(tracer.pid, signal.SIGKILL)
    err = tracer.communicate()[1]
left = []
while True:                                          # the program, if there was one
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    left.append(os.waitstatus_to_exitcode(status))
print(json.dumps({"set_up": b"tracing data accesses" in err, "programs": left}))
"""


def test_the_program_finishes_when_the_tracer_is_killed_around_a_warm_start(tmp_path, own_cache):
    """madtrace is SIGKILLed at points spread over a warm run's start, counted
    from the program's exec (before the set-up ends, while the warm start lays out copies and points entries at them,
    and after): a program that began to run always exits 0 with its native output
    (the guard takes the pages back, the entries jump to copies that run as plain
    code).  A child killed before its exec dies with madtrace (PTRACE_O_EXITKILL,
    process/tracee.py): it has run nothing of the program."""
    argv = [prog("bench_data_memory", "O2-nopie"), "16000", "4096"]    # about 2 s recorded
    native = subprocess.run(argv, capture_output=True, timeout=120).stdout
    madtrace_accesses(tmp_path / "cold", argv, HYBRID)          # the list to lay out
    seen = {True: 0, False: 0}
    ran_before_set_up = 0        # killed in the set-up, the warm start among it
    for k, delay in enumerate((0.0, 0.02, 0.05, 0.08, 0.12, 0.2, 0.4, 0.8)):
        out = tmp_path / f"out{k}"
        command = MADTRACE + ["record", "--data", "--no-functions", *HYBRID,
                              "-o", str(tmp_path / f"k{k}"), "--", *argv]
        done = subprocess.run([sys.executable, "-c", KILL_ONE, str(delay), str(out),
                               os.path.realpath(argv[0]), *command],
                              capture_output=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=ROOT))
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        seen[result["set_up"]] += 1
        ran_before_set_up += not result["set_up"] and result["programs"] == [0]
        allowed = ([0],) if result["set_up"] else ([], [0], [-9])
        assert result["programs"] in allowed, (delay, result)
        if result["programs"] == [0]:
            assert out.read_bytes() == native, (delay, out.read_bytes()[-200:])
    assert seen[True] >= 1 and ran_before_set_up >= 1, (seen, ran_before_set_up)
