# SPDX-License-Identifier: GPL-2.0-or-later
"""Function tracing (-f) is exact: every call of every selected function is
counted, whatever the way in (call, tail jmp, indirect call, PLT, callback
from libc, another thread) or out (return, longjmp).

Contract exercised, through the CLI only:
  madtrace record -q -o DIR -f PATTERN... [--no-time] -- PROG ARGS
  madtrace summary DIR --json   ->  {"calls": {name: completed_calls}, "dropped_events": 0, ...}

Oracle: valgrind's callgrind on the same binary (tests/oracles.py, itself
checked in tests/test_oracles.py), which counts entries; and the untraced run
for the output and the exit status.  A call abandoned by longjmp is over
once it has been unwound, so it counts as completed like any other.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from madtrace.trace.reader import iter_call_chunks

from .oracles import callgrind_calls, program_output
from .util import VARIANTS, madtrace, prog, summary_json

# program -> (arguments, -f patterns)
CASES = {
    "calls_recursion": ([], ["fib", "is_even", "is_odd", "depth_sum"]),
    "calls_tail": ([], ["tail_?", "finish", "dispatch", "op?", "gcd"]),
    "calls_plt": (["500"], ["fill", "mix", "libc.so.6:malloc", "libc.so.6:free",
                            "libc.so.6:calloc", "libc.so.6:realloc", "libc.so.6:strdup"]),
    "calls_qsort": ([], ["cmp_*", "check_sorted"]),
    "calls_callbacks": ([], ["op_*", "apply", "run_table"]),
    "calls_longjmp": ([], ["dive", "bail", "after", "attempt"]),
    "calls_threads": ([], ["work", "leaf_op", "thread_main", "libc.so.6:malloc",
                           "libc.so.6:free"]),
    # %fs:0 not the thread pointer for a while: rings found by the fs base itself
    "calls_fsword": ([], ["run", "step"]),
}

MODES = {"time": [], "no-time": ["--no-time"]}


@lru_cache(maxsize=None)
def expected_calls(argv: tuple, patterns: tuple) -> dict:
    calls = callgrind_calls(list(argv), list(patterns), timeout=120)
    return {name: n for name, n in calls.items() if n}


@lru_cache(maxsize=None)
def untraced(argv: tuple):
    return program_output(list(argv))


def record(tmp_path, argv, patterns, extra=()):
    out = tmp_path / "trace"
    args = ["record", "-q", "-o", str(out), *extra]
    for p in patterns:
        args += ["-f", p]
    return madtrace(*args, "--", *argv, timeout=300), out


def check_exact(tmp_path, argv: list, patterns: list, extra=()) -> None:
    native = untraced(tuple(argv))
    result, out = record(tmp_path, argv, patterns, extra)
    assert result.returncode == native.returncode, result.stderr.decode()
    assert result.stdout == native.stdout
    s = summary_json(out)
    assert s["dropped_events"] == 0
    got = {name: n for name, n in s["calls"].items() if n}
    assert got == expected_calls(tuple(argv), tuple(patterns))
    check_timestamps(out, timed="--no-time" not in extra)


def check_timestamps(out, timed: bool) -> None:
    """Each thread's records carry non-decreasing TSC values (0 without timestamps)."""
    for _, chunk in iter_call_chunks(str(out)):
        tsc = chunk["tsc"]
        if timed:
            assert tsc.min() > 0 and (np.diff(tsc.astype(np.int64)) >= 0).all()
        else:
            assert not tsc.any()


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_call_counts_equal_callgrind(tmp_path, name, variant, mode):
    args, patterns = CASES[name]
    check_exact(tmp_path, [prog(name, variant), *args], patterns, MODES[mode])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name,args,patterns", [
    # strlen is a GNU IFUNC in libc: the calls go to the implementation its
    # resolver chose (__strlen_evex, __strlen_avx2...), counted as "strlen"
    ("calls_plt", ["300"], ["libc.so.6:strlen", "libc.so.6:malloc"]),
    # tail_strlen ends in "jmp strlen@plt"
    ("calls_tail", [], ["tail_strlen", "libc.so.6:strlen"]),
])
def test_ifunc_library_function(tmp_path, variant, name, args, patterns):
    check_exact(tmp_path, [prog(name, variant), *args], patterns)


def test_counts_do_not_depend_on_the_variant(tmp_path):
    """Same source, same counts: the four builds of calls_callbacks agree
    with each other as well as with callgrind."""
    args, patterns = CASES["calls_callbacks"]
    seen = []
    for variant in VARIANTS:
        (tmp_path / variant).mkdir()
        result, out = record(tmp_path / variant, [prog("calls_callbacks", variant), *args],
                             patterns)
        assert result.returncode == 0, result.stderr.decode()
        seen.append({k: v for k, v in summary_json(out)["calls"].items() if v})
    assert all(s == seen[0] for s in seen)


@pytest.mark.parametrize("pattern", ["no_such_function_xyz", "libc.so.6:no_such_function_xyz"])
def test_unknown_function_is_a_one_line_error(tmp_path, pattern):
    result, _ = record(tmp_path, [prog("calls_recursion", "O2-pie")], [pattern])
    err = result.stderr.decode()
    assert result.returncode == 16, (result.returncode, err)
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("madtrace: ") and "no_such_function_xyz" in lines[0], lines[0]


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
@pytest.mark.parametrize("name,args,bare,oracle", [
    # bare names of library functions resolve to the module the PLT binds them to
    ("calls_plt", ["200"], ["malloc", "free", "fill"], ["libc.so.6:malloc", "libc.so.6:free", "fill"]),
    ("calls_qsort", [], ["qsort", "cmp_*"], ["libc.so.6:qsort", "cmp_*"]),
])
def test_bare_library_function_names(tmp_path, variant, name, args, bare, oracle):
    argv = [prog(name, variant), *args]
    native = untraced(tuple(argv))
    result, out = record(tmp_path, argv, bare)
    assert result.returncode == native.returncode, result.stderr.decode()
    assert result.stdout == native.stdout
    got = {n: c for n, c in summary_json(out)["calls"].items() if c}
    assert got == expected_calls(tuple(argv), tuple(oracle))


@pytest.mark.parametrize("pattern,needle", [
    ("str*", "did you mean 'libc.so.6:str*' ("),          # a glob: the main executable's only
    ("*:no_such_fn*", "no function matches '*:no_such_fn*'"),
])
def test_function_spec_errors_say_where(tmp_path, pattern, needle):
    result, _ = record(tmp_path, [prog("calls_plt", "O2-pie"), "5"], [pattern])
    err = result.stderr.decode()
    assert result.returncode == 16, (result.returncode, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], err


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_call_in_the_first_bytes_of_an_entry_patched_caller(tmp_path, variant):
    """data_globals -O2: main (its address is taken: patched at its entry) starts
    with push rbp; mov rbp, rsp; call fill, so main's entry patch moves that call
    into its trampoline.  fill is then patched at its entry too (plan.py
    ``early_site``); its call-site patch was written over main's jump before, and
    the program died of SIGSEGV at its first call.  Also without -f (every
    function, the default)."""
    argv = [prog("data_globals", variant)]
    check_exact(tmp_path, argv, ["main", "fill", "sum", "count_vowels"])
    native = untraced(tuple(argv))
    result = madtrace("record", "-q", "--no-store", "-o", str(tmp_path / "all"), "--", *argv)
    assert (result.returncode, result.stdout) == (native.returncode, native.stdout), result.stderr
