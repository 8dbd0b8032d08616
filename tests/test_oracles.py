# SPDX-License-Identifier: GPL-2.0-or-later
"""The oracle of the function-tracing tests checked on its own: callgrind's
call counts, as tests/oracles.py reads them, against counts known in
advance (closed formulas, the programs' own counters, objdump).

If these pass, a mismatch in tests/test_calls.py is madtrace's."""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache

import pytest

from . import oracles
from .oracles import callgrind_run, parse_callgrind, program_output, select_calls, self_counts
from .util import VARIANTS, prog

# program -> arguments; every calls_* program prints a "calls:" line
PROGRAMS = {
    "calls_recursion": [],
    "calls_tail": [],
    "calls_plt": ["600"],
    "calls_qsort": [],
    "calls_callbacks": [],
    "calls_longjmp": [],
    "calls_threads": [],
    "calls_fsword": [],
}


@lru_cache(maxsize=None)
def run(name: str, variant: str, args: tuple = ()):
    return callgrind_run([prog(name, variant), *(args or PROGRAMS[name])], timeout=60)


def objdump(path: str) -> str:
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                          text=True, check=True).stdout


def function_body(disasm: str, fname: str) -> str:
    m = re.search(rf"^[0-9a-f]+ <{re.escape(fname)}>:\n(.*?)\n\n", disasm, re.S | re.M)
    assert m, f"{fname} not in the disassembly"
    return m.group(1)


# ------------------------------------------------------------ the parser
def test_parse_compressed_names_cob_and_recursion_suffixes(tmp_path):
    f = tmp_path / "callgrind.out"
    f.write_text("""# callgrind format
version: 1
events: Ir
ob=(1) /bin/prog
fl=(1) prog.c
fn=(1) main
3 10
cob=(2) /lib/libc.so.6
cfi=(2) malloc.c
cfn=(2) malloc
calls=3 0
3 30
cfn=(3) fib
calls=1 0
4 100
cob=(2)
cfi=(2)
cfn=(2)
calls=2 0
5 20

fn=(3)
5 1
cfn=(4) fib'2
calls=7 0
5 70

fn=(4)
cfn=(4)
calls=5 0
6 1

ob=(2)
fl=(2)
fn=(2)
1 1
totals: 1
""")
    entries, defined = parse_callgrind(str(f))
    assert entries == {("/lib/libc.so.6", "malloc"): 5, ("/bin/prog", "fib"): 13}
    assert defined == {("/bin/prog", "main"), ("/bin/prog", "fib"), ("/lib/libc.so.6", "malloc")}
    assert select_calls(entries, "/bin/prog", ["fi?", "main"]) == {"fib": 13, "main": 0}
    assert select_calls(entries, "/bin/prog", None) == {"fib": 13, "libc.so.6:malloc": 5}


# ------------------------------------------------------------ the programs
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_callgrind_counts_equal_the_programs_own_counts(name, variant):
    """Every function that counts its own entries was entered exactly that
    often according to callgrind; the output under callgrind is the native
    output; every function that was called also ran (cob= read right)."""
    argv = [prog(name, variant), *PROGRAMS[name]]
    native = program_output(argv)
    r = run(name, variant)
    assert native.returncode == r.returncode == 0
    assert r.stdout == native.stdout
    own = self_counts(native.stdout)
    assert r.calls(list(own)) == own
    assert set(r.entries) <= r.defined


def test_recursion_counts_by_formula():
    """fib(n) makes 2*F(n+1)-1 calls (21891 for n=20); is_even(m)/is_odd
    alternate until 0 (m+1 entries), also at -O2 where they tail-jump."""
    for variant in ("O0-pie", "O2-pie"):
        for n, m in ((20, 1001), (15, 60)):
            c = run("calls_recursion", variant, (str(n), str(m))).calls(
                ["fib", "is_even", "is_odd", "depth_sum"])
            fibs = [0, 1]
            while len(fibs) < n + 3:
                fibs.append(fibs[-1] + fibs[-2])
            assert c["fib"] == 2 * fibs[n + 1] - 1
            # is_even(m) then is_odd(m // 2)
            assert c["is_even"] + c["is_odd"] == (m + 1) + (m // 2 + 1)
            assert c["depth_sum"] == 501
    assert run("calls_recursion", "O0-pie", ("20", "1001")).calls(["fib"]) == {"fib": 21891}


def test_tail_jumps_are_entries():
    """At -O2 the mutual recursion and the tail_* chain are jmps (objdump);
    callgrind still counts each jmp into a function as one entry of it."""
    path = prog("calls_recursion", "O2-pie")
    text = objdump(path)
    assert re.search(r"\tjmp +[0-9a-f]+ <is_odd>", function_body(text, "is_even"))
    assert re.search(r"\tjmp +[0-9a-f]+ <is_even>", function_body(text, "is_odd"))
    c = run("calls_recursion", "O2-pie", ("20", "1001")).calls(["is_even", "is_odd"])
    # is_even(1001) -> is_odd(1000) -> ... -> is_odd(0): 501 + 501, then
    # is_odd(500) -> ... -> is_odd(0): 250 + 251
    assert c == {"is_even": 501 + 250, "is_odd": 501 + 251}

    text = objdump(prog("calls_tail", "O2-nopie"))
    assert re.search(r"\tjmp +[0-9a-f]+ <tail_b>", function_body(text, "tail_a"))
    assert re.search(r"\tjmp +[0-9a-f]+ <tail_c>", function_body(text, "tail_b"))
    assert re.search(r"\tjmp +\*", function_body(text, "dispatch"))
    assert re.search(r"\tjmp +[0-9a-f]+ <strlen@plt>", function_body(text, "tail_strlen"))
    c = run("calls_tail", "O2-nopie").calls(["tail_?", "dispatch", "op?", "libc.so.6:strlen"])
    n = 3000
    assert c["tail_a"] == c["tail_b"] == c["dispatch"] == n
    assert c["tail_c"] == n // 2                     # tail_b(x) goes on to tail_c when x is odd
    assert sum(c[f"op{k}"] for k in range(4)) == n
    assert c["strlen"] == n // 3                    # the tail jump through the PLT into libc


def test_self_tail_recursion_loop_counts_real_entries():
    """gcd is self tail recursive: at -O0 every step is a call, at -O2 gcc
    makes it a loop (no call or jmp to itself left), one entry per call."""
    def steps(a, b):
        k = 1
        while b:
            a, b, k = b, a % b, k + 1
        return k
    n = 3000
    expected_o0 = sum(steps(i * 7 + 12, 18 + i % 97) for i in range(n))
    assert run("calls_tail", "O0-pie").calls(["gcd"]) == {"gcd": expected_o0}
    body = function_body(objdump(prog("calls_tail", "O2-pie")), "gcd")
    assert "<gcd>" not in body
    assert run("calls_tail", "O2-pie").calls(["gcd"]) == {"gcd": n}


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_plt_calls_from_program_and_from_libc(variant):
    """malloc/free/strlen/calloc/realloc are counted on every entry: the
    program's direct calls through its PLT, plus strdup's own malloc and
    strlen inside libc, plus printf's strlen for each "%s" line; what is
    left is a small constant independent of N (stdout's buffer)."""
    fns = ["libc.so.6:malloc", "libc.so.6:free", "libc.so.6:strlen", "libc.so.6:calloc",
           "libc.so.6:realloc", "libc.so.6:strdup"]
    rest = []
    for n in (200, 700):
        r = run("calls_plt", variant, (str(n),))
        d = self_counts(r.stdout, "direct")
        c = r.calls(fns)
        lines = (n + 99) // 100
        assert c["strdup"] == d["strdup"] == n
        assert c["calloc"] == d["calloc"] and c["realloc"] == d["realloc"]
        rest.append((c["malloc"] - d["malloc"] - d["strdup"],
                     c["free"] - d["free"],
                     c["strlen"] - d["strlen"] - d["strdup"] - lines))
    assert rest[0] == rest[1]
    assert rest[0] == (1, 0, 0)    # the one malloc is stdout's buffer


def test_ifunc_resolver_and_ld_so_twins_are_not_counted():
    """libc's strlen is an IFUNC: callgrind sees the resolver entered by ld.so
    and the calls going to __strlen_<isa>; ld.so has its own strlen.  Only
    the implementation's entries count as libc.so.6:strlen."""
    r = run("calls_plt", "O0-pie", ("200",))
    libc = [(o, f) for (o, f) in r.entries if o.endswith("/libc.so.6")]
    assert any(f == "strlen" for _, f in libc)                         # the resolver
    impls = {f for _, f in libc if re.match(r"__strlen_\w+$", f)}
    assert len(impls) == 1, impls
    assert any(o.endswith("ld-linux-x86-64.so.2") and f == "strlen" for o, f in r.entries)
    d = self_counts(r.stdout, "direct")
    assert r.calls(["libc.so.6:strlen"])["strlen"] == d["strlen"] + d["strdup"] + 2
    assert r.calls(["strlen"]) == {"strlen": 0}    # not a function of the program


def test_threads_counts_are_deterministic():
    """Thread k calls work N*k times, main N times; malloc every 16th work."""
    for threads, n in ((4, 3000), (2, 500)):
        calls = run("calls_threads", "O2-pie", (str(threads), str(n))).calls(
            ["work", "leaf_op", "thread_main", "libc.so.6:malloc"])
        per = [n * k for k in range(1, threads + 1)] + [n]
        assert calls["work"] == calls["leaf_op"] == sum(per)
        assert calls["thread_main"] == threads
        assert calls["malloc"] == sum((m + 15) // 16 for m in per) + 1
    # libc's locking internals (futex waits...) vary with scheduling; these do not
    STABLE = ["work", "leaf_op", "thread_main", "libc.so.6:malloc", "libc.so.6:free",
              "libc.so.6:calloc", "libc.so.6:realloc"]
    again = callgrind_run([prog("calls_threads", "O2-pie"), "2", "500"]).calls(STABLE)
    assert again == run("calls_threads", "O2-pie", ("2", "500")).calls(STABLE)


def test_longjmp_abandoned_calls_are_entries():
    rounds = 200
    c = run("calls_longjmp", "O0-nopie").calls(["dive", "bail", "after", "attempt"])
    assert c["dive"] == sum(2 + (r * 7) % 12 for r in range(rounds))
    assert c["bail"] == c["attempt"] == rounds
    assert c["after"] == rounds + len(range(0, rounds, 3)) + 1


def test_every_counted_function_is_a_symbol_without_clones():
    """At -O2 no function was cloned (.isra/.constprop/.part) or inlined
    away: every function the tests select is a symbol of its own."""
    for name in PROGRAMS:
        for variant in ("O2-pie", "O2-nopie"):
            syms = subprocess.run(["nm", prog(name, variant)], capture_output=True, text=True,
                                  check=True).stdout
            assert not re.search(r"\.(isra|constprop|part|cold)\b", syms), (name, variant)
            own = self_counts(program_output([prog(name, variant), *PROGRAMS[name]]).stdout)
            defined = {line.split()[-1] for line in syms.splitlines() if " T " in line}
            assert set(own) <= defined, (name, variant, set(own) - defined)


def test_callgrind_options_are_the_documented_ones():
    assert "--skip-plt=yes" in oracles.CALLGRIND_OPTIONS
    assert "--separate-recs=1" in oracles.CALLGRIND_OPTIONS
