# SPDX-License-Identifier: GPL-2.0-or-later
"""Independent oracles for the function-tracing tests.

``callgrind_calls(argv, functions)`` runs the program under valgrind's
callgrind and returns how many times each selected function was *entered*,
by any caller in the process (the main executable, libc itself, ld.so) and
by any means (``call``, ``call *reg``, a tail ``jmp`` into another function,
a call through the PLT).  Callgrind counts a call when it is made, so a call
that is later abandoned by ``longjmp`` is still counted once.

How callgrind's data is read (checked by tests/test_oracles.py):

* Every ``calls=N ...`` line belongs to the ``cfn=`` (called function) just
  before it; the called object is the preceding ``cob=`` if one was given
  for this call, else the caller's ``ob=``.  Summing ``N`` over all callers
  of a function gives its number of entries.
* Recursion: callgrind names deeper recursion levels ``fib'2``, ``fib'3``
  (``--separate-recs``, 2 by default); we pass ``--separate-recs=1`` and
  ``--separate-callers=0`` and still strip anything from the first ``'``.
* Tail calls: a ``jmp`` from one function into another is recorded as a call
  of the target (its entry), the jumping function's frame being reused.
* PLT: with ``--skip-plt=yes`` (the default, passed explicitly) the PLT stub
  is transparent: the call is recorded from the real caller to the real
  library function (``cfn=malloc``, ``cob=.../libc.so.6``).
* Aliases: a library function has several names at one address (``malloc``,
  ``__libc_malloc``); callgrind reports one of them, so a selected function
  counts every callee name at its address (from ``nm``).
* IFUNCs: ``strlen`` in libc is a GNU indirect function.  The symbol itself is
  the resolver (called by ld.so while relocating, not by the program); the
  calls go to the implementation the resolver picked, ``__strlen_avx2`` or
  ``__strlen_evex`` and so on (under valgrind, which has no AVX-512, often a
  different one than natively).  For a selected IFUNC we therefore count the
  entries of every ``__NAME_<isa>...`` implementation and not the resolver.
* Functions of the same name in several objects (ld.so has its own
  ``strlen``, ``memset``...) are kept apart: a plain name selects the main
  executable's function, ``LIB:NAME`` (``libc.so.6:malloc``) a library's.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache

VALGRIND = shutil.which("valgrind") or "/usr/bin/valgrind"

CALLGRIND_OPTIONS = (
    "--tool=callgrind",
    "--compress-strings=no",
    "--compress-pos=no",
    "--separate-recs=1",       # one name per function whatever the recursion depth
    "--separate-callers=0",    # no caller contexts in names
    "--separate-threads=no",   # one file for all threads
    "--skip-plt=yes",          # a call through the PLT is a call of the target
    "--dump-instr=no",
    "--dump-line=yes",
    "--collect-atstart=yes",
    "--trace-children=no",
    "--demangle=no",           # C++ functions by their symbol names, as madtrace names them
)

# suffixes of glibc's x86-64 multiarch implementations (__strlen_avx2, ...)
_ISA = r"(?:sse2|ssse3|sse4_1|sse4_2|sse42|avx|avx2|avx512|avx512f|avx512bw|evex|evex512|erms)"


@dataclass
class CallgrindRun:
    """One program run under callgrind."""
    returncode: int
    stdout: bytes
    stderr: bytes
    main_object: str
    # (object path, function name) -> number of entries
    entries: dict = field(default_factory=dict)
    # (object path, function name) of every function that ran
    defined: set = field(default_factory=set)

    def calls(self, functions=None) -> dict:
        return select_calls(self.entries, self.main_object, functions)


# ---------------------------------------------------------------- parsing
_NAME_RE = re.compile(r"^\((\d+)\)(?: (.*))?$")


def _plain_name(name: str) -> str:
    """``fib'2`` -> ``fib`` (recursion levels and caller contexts)."""
    return name.split("'", 1)[0]


def parse_callgrind(path: str) -> tuple[dict, set]:
    """Parse a callgrind output file.

    Returns ``(entries, defined)``: ``entries`` maps (object, function) to the
    summed ``calls=`` counts into it from all callers; ``defined`` is the set of
    (object, function) pairs that appear as ``fn=`` (functions that ran).
    Works with and without ``--compress-strings``.
    """
    tables = {"ob": {}, "fl": {}, "fn": {}}

    def name(kind: str, value: str) -> str:
        m = _NAME_RE.match(value)
        if not m:
            return value
        ident, text = m.group(1), m.group(2)
        if text is not None:
            tables[kind][ident] = text
            return text
        return tables[kind][ident]

    entries: dict = {}
    defined: set = set()
    ob = ""
    cob = None
    cfn = None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line[0].isdigit() or line[0] in "+-*#":
                continue                          # cost lines, comments
            key, sep, value = line.partition("=")
            if not sep:
                continue                          # "events:", "totals:" ...
            if key == "ob":
                ob = name("ob", value)
                cob = None
            elif key == "fn":
                defined.add((ob, _plain_name(name("fn", value))))
                cob = None
            elif key == "cob":
                cob = name("ob", value)
            elif key in ("fl", "fi", "fe", "cfi", "cfl", "jfi"):
                name("fl", value)
            elif key in ("cfn", "jfn"):
                n = name("fn", value)
                if key == "cfn":
                    cfn = _plain_name(n)
            elif key == "calls":
                count = int(value.split()[0])
                target = (cob if cob is not None else ob, cfn)
                entries[target] = entries.get(target, 0) + count
                cob = None                        # cob= is given per call
    return entries, defined


# ---------------------------------------------------------------- symbols
@lru_cache(maxsize=None)
def _symbols(path: str) -> tuple[dict, dict]:
    """(name -> address, name -> nm type letter) of an ELF file's defined
    functions, from its static and dynamic symbol tables."""
    addrs: dict = {}
    types: dict = {}
    for extra in ([], ["-D"]):
        r = subprocess.run(["nm", *extra, "--defined-only", path], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) != 3 or parts[1] not in "TtWiu":
                continue
            addr, typ, sym = parts
            sym = sym.split("@", 1)[0]
            addrs.setdefault(sym, int(addr, 16))
            types.setdefault(sym, typ)
    return addrs, types


def _aliases(path: str, fname: str) -> set:
    addrs, _ = _symbols(path)
    if fname not in addrs:
        return {fname}
    return {n for n, a in addrs.items() if a == addrs[fname]} | {fname}


def _is_ifunc(path: str, fname: str) -> bool:
    return _symbols(path)[1].get(fname) == "i"


def _object_matches(obj: str, lib: str) -> bool:
    base = os.path.basename(obj)
    return base == lib or os.path.basename(os.path.realpath(obj)) == lib


def select_calls(entries: dict, main_object: str, functions=None) -> dict:
    """Entries per selected function, keyed by plain function name.

    ``functions``: glob patterns over the main executable's function names
    (``fib``, ``op_*``) and ``LIB:NAME`` for a library function
    (``libc.so.6:malloc``).  ``None``: every function of the main executable
    by plain name, and every other function as ``OBJECT_BASENAME:NAME``.
    A function named exactly (no wildcard) that was never entered counts 0.
    A library glob (``libc.so.6:mem*``) sums callgrind's names as they are
    (no alias or IFUNC folding).
    """
    main_real = os.path.realpath(main_object)

    def is_main(obj: str) -> bool:
        return obj == main_object or os.path.realpath(obj) == main_real

    if functions is None:
        out: dict = {}
        for (obj, fn), n in entries.items():
            key = fn if is_main(obj) else f"{os.path.basename(obj)}:{fn}"
            out[key] = out.get(key, 0) + n
        return out

    out = {}
    for spec in functions:
        if ":" in spec:
            lib, fname = spec.split(":", 1)
            objs = {obj for obj, _ in entries if _object_matches(obj, lib)}
            if any(c in fname for c in "*?["):
                for (o, fn), n in entries.items():
                    if o in objs and fnmatch.fnmatchcase(fn, fname):
                        out[fn] = out.get(fn, 0) + n
                continue
            total = 0
            for obj in objs:
                if _is_ifunc(obj, fname):
                    impl = re.compile(rf"^__{re.escape(fname)}_{_ISA}(?:_\w+)?$")
                    names = {fn for o, fn in entries if o == obj and impl.match(fn)}
                else:
                    names = _aliases(obj, fname)
                total += sum(n for (o, fn), n in entries.items() if o == obj and fn in names)
            out[fname] = out.get(fname, 0) + total
        else:
            matched = {fn for obj, fn in entries if is_main(obj) and fnmatch.fnmatchcase(fn, spec)}
            if not any(c in spec for c in "*?["):
                matched.add(spec)
            for fname in matched:
                names = _aliases(main_real, fname)
                out[fname] = sum(n for (o, fn), n in entries.items() if is_main(o) and fn in names)
    return out


# ---------------------------------------------------------------- running
def callgrind_run(argv: list, timeout: float = 120, env=None, stdin=b"") -> CallgrindRun:
    """Run ``argv`` under callgrind (stdout and stderr piped, as in the tests'
    untraced and traced runs) and parse the result."""
    exe = shutil.which(argv[0]) or argv[0]
    with tempfile.TemporaryDirectory(prefix="madtrace-cg-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        log = os.path.join(tmp, "valgrind.log")
        r = subprocess.run([VALGRIND, *CALLGRIND_OPTIONS, f"--callgrind-out-file={out}",
                            f"--log-file={log}", "--", exe, *argv[1:]],
                           input=stdin, capture_output=True, timeout=timeout, env=env)
        if not os.path.exists(out):
            with open(log, errors="replace") as f:
                raise RuntimeError(f"callgrind wrote no output for {argv!r}:\n{f.read()}")
        entries, defined = parse_callgrind(out)
    return CallgrindRun(r.returncode, r.stdout, r.stderr, os.path.realpath(exe), entries, defined)


def callgrind_calls(argv: list, functions=None, timeout: float = 120, env=None) -> dict:
    """Number of entries of each selected function in one run of ``argv``
    under callgrind (see ``select_calls`` for ``functions``)."""
    return callgrind_run(argv, timeout=timeout, env=env).calls(functions)


def program_output(argv: list, timeout: float = 60, env=None, stdin=b"") -> subprocess.CompletedProcess:
    """The untraced run: exit status, stdout and stderr (bytes)."""
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, env=env)


def self_counts(stdout: bytes, label: str = "calls") -> dict:
    """The ``LABEL: name=count ...`` line the calls_* programs print about
    themselves."""
    for line in stdout.decode().splitlines():
        if line.startswith(label + ":"):
            return {k: int(v) for k, v in (item.split("=") for item in line.split()[1:])}
    raise ValueError(f"no '{label}:' line in {stdout!r}")


# ---------------------------------------------------------------- lackey
def lackey_accesses(argv: list, code_range: tuple[int, int], data_ranges,
                    timeout: float = 300) -> dict[tuple[int, str], int]:
    """Per-instruction load/store counts from ``valgrind --tool=lackey
    --trace-mem=yes``: {(instruction address, "L"|"S"): n} for instructions in
    ``code_range`` whose data address falls in one of ``data_ranges``.  Lackey's
    "M" (modify) counts one load and one store.  Addresses are absolute, so the
    program must be non-PIE (valgrind loads PIE executables elsewhere).
    ``data_ranges`` may be a function of the program's stderr (under valgrind)
    returning the ranges, for ranges only the program knows (its brk heap)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "lackey.log")
        run = subprocess.run(["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={log}",
                              *argv], capture_output=True, timeout=timeout, check=True)
        if callable(data_ranges):
            data_ranges = data_ranges(run.stderr.decode())
        return parse_lackey(log, code_range, data_ranges)


def parse_lackey(log: str, code_range: tuple[int, int], data_ranges) -> dict[tuple[int, str], int]:
    """{(instruction, "L"|"S"): n} from a lackey --trace-mem log (or madtrace's
    lackey export), for instructions in ``code_range`` and data in ``data_ranges``."""
    counts: dict[tuple[int, str], int] = {}
    current = None
    lo, hi = code_range
    with open(log) as f:
        for line in f:
            if line.startswith("I "):
                addr = int(line[3:].split(",")[0], 16)
                current = addr if lo <= addr < hi else None
                continue
            if current is None or len(line) < 3 or line[0] != " " or line[1] not in "LSM":
                continue
            kind = line[1]
            addr = int(line[3:].split(",")[0], 16)
            if not any(a <= addr < b for a, b in data_ranges):
                continue
            for k in ("LS" if kind == "M" else kind):
                counts[(current, k)] = counts.get((current, k), 0) + 1
    return counts
