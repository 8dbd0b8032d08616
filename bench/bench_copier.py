# SPDX-License-Identifier: GPL-2.0-or-later
"""The hybrid engine's function copier against main's: the same copies, and the time a copy takes.

1. Equality (``--compare``, the default): every function of the machine's
   python3, of libc.so.6 and of every program under build/tests (symbols with
   a size, and every .eh_frame FDE), copied by main's ``copy_function``
   (imported from ``--main``, default /work/main) and by this tree's, to the
   same address, with the same ``new_id`` and three ``want_probe``
   selections (every memory operand; all but stack-based ones, as the
   rewriter does; about two in three): the bytes, ``old_to_new``,
   ``probes``, ``stubs``, ``unprobed``, ``returns``, ``targets``,
   ``code_size``, refusals (their reason) and the sequence of ``new_id``
   calls must be equal.  This tree's copies of one function share one
   analysis (as the rewriter's copies of a function do).  The data stubs'
   ``redirect_operand`` (which now shares the copier's operand re-encoder)
   is compared too, on every instruction with a memory operand.  Prints the
   number of copies and instructions compared and of differences (and the
   first few).

2. Time (``--time``): ms per copy by function size, median of ``--repeat``
   fresh processes (each one cold: no analysis, no per-instruction entries),
   of main's ``copy_function``, of this tree's first copy of a function
   (``analyse`` + ``copy_function``) and of a second copy with more probes
   (the analysis kept), on every ``--stride``-th function of python3 and libc.

3. A whole run (``--record N``): ``madtrace record --data --data-engine hybrid``
   of the machine's python3 running a short script (a dict of 10000 string
   keys), main's tree and this one in turn, N runs each: wall and CPU seconds
   of the run, and the seconds in the rewriter's ``copy_function`` and
   ``analyse`` (bench/copy_timer.py), per copy; the script's output must be
   the native one.

Usage: bench/bench_copier.py [--compare] [--time] [--record N] [--main DIR] [--repeat N]
       [--stride N]
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import resource
import shutil
import tempfile
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from madtrace.arch.x86_64 import function_copy as this  # noqa: E402
from madtrace.binary.eh_frame import EhFrame  # noqa: E402
from madtrace.binary.elf import ElfImage, NotElfError  # noqa: E402
from madtrace.target.templates import load_injector  # noqa: E402

CTL, BITMAP = 0x7F0000001000, 0x7F1000002000
SIZES = ((0, 128), (128, 512), (512, 2048), (2048, 8192), (8192, 1 << 40))
WANTS = {
    "all": lambda mem: True,
    "no-stack": lambda mem: mem.operands[0].base != "rsp",
    "two-in-three": lambda mem: (mem.address * 7) % 3 != 0,
}


def main_copier(path: str):
    """main's function_copy module, imported as the package ``madtrace_main``."""
    spec = importlib.util.spec_from_file_location(
        "madtrace_main", os.path.join(path, "madtrace", "__init__.py"),
        submodule_search_locations=[os.path.join(path, "madtrace")])
    package = importlib.util.module_from_spec(spec)
    sys.modules["madtrace_main"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("madtrace_main.arch.x86_64.function_copy")


def binaries() -> list[str]:
    python = os.path.realpath("/usr/bin/python3")
    libc = next(line.split("=>")[1].split()[0] for line in subprocess.run(
        ["ldd", python], capture_output=True, text=True).stdout.splitlines() if "libc.so" in line)
    tests = os.path.join(ROOT, "build", "tests")
    progs = sorted(os.path.join(tests, n) for n in os.listdir(tests)) if os.path.isdir(tests) else []
    return [python, os.path.realpath(libc)] + [p for p in progs if os.path.isfile(p)]


def functions(path: str):
    """(start, end, code) of each function of ``path``, and an address to copy them to."""
    try:
        image = ElfImage.load(path)
    except NotElfError:
        return [], 0
    ranges: dict[int, int] = {}
    for symbol in image.functions():
        if symbol.size and symbol.address:
            ranges.setdefault(symbol.address, symbol.address + symbol.size)
    eh = EhFrame(image)
    for _start, fde_at in eh.table:
        fde = eh._fde(fde_at)
        if fde is not None and fde.end > fde.start:
            ranges.setdefault(fde.start, fde.end)
    out = []
    for start, end in sorted(ranges.items()):
        section = image.section_at(start)
        if section is None or not section.is_exec or end > section.address + section.size:
            continue
        out.append((start, end, bytes(image.read(section.offset + start - section.address, end - start))))
    top = max(s.address + s.size for s in image.sections if s.is_alloc)
    return out, (top + (1 << 20)) & ~0xFFFF


def outcome(copy) -> tuple:
    if not hasattr(copy, "code"):
        return ("refused", copy.reason)
    return (copy.start, copy.end, copy.address, copy.code, copy.old_to_new,
            [_fields(p) for p in copy.probes], copy.unprobed, copy.targets,
            [_fields(s) for s in copy.stubs], copy.code_size, copy.returns)


def _fields(record) -> tuple:
    """A Probe's or Stub's fields (main's are dataclasses, this tree's named tuples)."""
    return dataclasses.astuple(record) if dataclasses.is_dataclass(record) else tuple(record)


FIELDS = ("start", "end", "address", "code", "old_to_new", "probes", "unprobed", "targets",
          "stubs", "code_size", "returns")


def copy_with(module, injector, function, address, want, analysis=None):
    start, end, code = function
    calls: list[int] = []

    def new_id(mem, *_) -> int:
        calls.append(mem.address)
        return (mem.address * 2654435761) % 100003 + 1

    extra = {} if analysis is None else {"analysis": analysis}
    copy = module.copy_function(code, start, end, address, injector, want, new_id, CTL, BITMAP, **extra)
    return outcome(copy), calls


def compare_redirect(old_redirect, function, address) -> tuple[int, int]:
    """(instructions compared, differences) of redirect_operand on ``function``."""
    from madtrace.arch.x86_64.decode import capstone_lite
    from madtrace.arch.x86_64.redirect import redirect_operand
    start, _end, code = function
    n = different = 0
    for at, size, mnemonic, op_str in capstone_lite().disasm_lite(code, start):
        if "[" not in op_str:
            continue
        raw = code[at - start:at - start + size]
        a, b = (f(raw, at, address, address + 0x1000 + at % 4096)
                for f in (old_redirect, redirect_operand))
        n += 1
        if (a if isinstance(a, bytes) else a.reason) != (b if isinstance(b, bytes) else b.reason):
            different += 1
            if different <= 3:
                print(f"DIFFERENT redirect_operand: {at:#x} '{mnemonic} {op_str}': {a} | {b}")
    return n, different


# hand-made functions: refusals, side entries, loops, stubs of every operand kind, VEX, moffs...
HAND_MADE = (
    "67e300c3", "66e90000c3", "c7f800000000c3", "e800000000c3", "7401f0480fb10ac3", "eb014889c8c3",
    "e2fee302c3c3c3", "ffe0", "ff2500000000", "ff642408", "64ff242510000000", "41ffe1", "ffe0c3",
    "67ff20", "ff20", "a01122334455667788c3", "8b0500000000c3", "", "e8fb0f0000", "e9fb0f0000",
    "480fb10a4801084883000141ff0c24c3", "c5f8100783c001c4c17a1001c3", "62f17c48100107c3",
    "8a2788e7c3", "48890c244889e0c3", "480fa3075fc3", "f348a5f3aac3", "660f6f07660fd60fc3",
    "0f8400000000c3", "f2e900000000", "3effe0", "648b042510000000658b0425c3000000c3",
    "8fe97890c0c3", "6767676767488b840000000000c3", "ff37ff30c3", "ff5008ff15000000003effd0c3")


def compare_hand_made(old, injector) -> tuple[int, int]:
    """(copies compared, differences) of HAND_MADE, copied near and far (2**46 away)."""
    n = different = 0
    start = 0x400000
    for text in HAND_MADE:
        code = bytes.fromhex(text)
        function = (start, start + len(code), code)
        analysis = this.analyse(code, start, start + len(code))
        reuse = analysis if isinstance(analysis, this.FunctionAnalysis) else None
        for address in (0x500000, 0x7F0000000000):
            for want in WANTS.values():
                n += 1
                if copy_with(old, injector, function, address, want) != \
                        copy_with(this, injector, function, address, want, reuse):
                    different += 1
                    print(f"DIFFERENT: hand-made {text} at {address:#x}")
    return n, different


def compare(main_dir: str) -> int:
    old = main_copier(main_dir)
    old_redirect = importlib.import_module("madtrace_main.arch.x86_64.redirect").redirect_operand
    injector = load_injector()
    total = differences = redirected = redirect_differences = 0
    per_binary = []
    for path in binaries():
        found, address = functions(path)
        n = 0
        for function in found:
            r, rd = compare_redirect(old_redirect, function, address)
            redirected += r
            redirect_differences += rd
            analysis = this.analyse(function[2], function[0], function[1])
            reuse = analysis if isinstance(analysis, this.FunctionAnalysis) else None
            for name, want in WANTS.items():
                a = copy_with(old, injector, function, address, want)
                b = copy_with(this, injector, function, address, want, reuse)
                total += 1
                n += 1
                if a != b:
                    differences += 1
                    if differences <= 10:
                        print(f"DIFFERENT: {path} {function[0]:#x} ({function[1] - function[0]} bytes), "
                              f"want {name}: {_difference(a, b)}")
        per_binary.append((os.path.basename(path), len(found), n))
    big = [row for row in per_binary if row[1] > 1000]
    print(f"compared {total} copies of {sum(r[1] for r in per_binary)} functions in "
          f"{len(per_binary)} binaries ({', '.join(f'{b}: {f} functions' for b, f, _ in big)}, "
          f"the rest under build/tests): {differences} differences")
    print(f"redirect_operand: {redirected} instructions with a memory operand compared, "
          f"{redirect_differences} differences")
    hand, hand_differences = compare_hand_made(old, injector)
    print(f"hand-made functions: {hand} copies compared, {hand_differences} differences")
    return 1 if differences or redirect_differences or hand_differences else 0


def _difference(a, b) -> str:
    (ca, ia), (cb, ib) = a, b
    if ca[0] == "refused" or cb[0] == "refused":
        return f"main {ca if ca[0] == 'refused' else 'copied'}, here {cb if cb[0] == 'refused' else 'copied'}"
    fields = [name for name, x, y in zip(FIELDS, ca, cb) if x != y]
    if ia != ib:
        fields.append("new_id calls")
    return "fields " + ", ".join(fields)


def time_once(main_dir: str, stride: int) -> dict:
    """One cold process's times (ms per copy by size class)."""
    old = main_copier(main_dir)
    injector = load_injector()
    sums: dict[str, list[float]] = {}
    paths = binaries()[:2]
    for path in paths:
        found, address = functions(path)
        for function in found[::stride]:
            size = function[1] - function[0]
            cls = next(f"{lo}-{hi}" if hi < 1 << 40 else f">={lo}" for lo, hi in SIZES if lo <= size < hi)
            row = sums.setdefault(cls, [0, 0.0, 0.0, 0.0, 0])
            t0 = time.perf_counter()
            copy_with(old, injector, function, address, WANTS["two-in-three"])
            t1 = time.perf_counter()
            analysis = this.analyse(function[2], function[0], function[1])
            if isinstance(analysis, this.FunctionAnalysis):
                copy_with(this, injector, function, address, WANTS["two-in-three"], analysis)
            t2 = time.perf_counter()
            if isinstance(analysis, this.FunctionAnalysis):
                copy_with(this, injector, function, address, WANTS["all"], analysis)
            t3 = time.perf_counter()
            row[0] += 1
            row[1] += t1 - t0
            row[2] += t2 - t1
            row[3] += t3 - t2
            row[4] += size
    return sums


def timing(main_dir: str, repeat: int, stride: int) -> None:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, __file__, "--time-once", "--main", main_dir,
                              "--stride", str(stride)], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()
    print(f"== ms per copy (median of {repeat} cold processes; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    print(f"{'bytes':>12} {'copies':>7} {'main':>9} {'first':>9} {'again':>9} {'main/first':>11}")
    classes = [f"{lo}-{hi}" if hi < 1 << 40 else f">={lo}" for lo, hi in SIZES] + ["all"]
    for cls in classes:
        rows = []
        for run in runs:
            if cls == "all":
                parts = list(run.values())
                rows.append([sum(p[k] for p in parts) for k in range(5)])
            elif cls in run:
                rows.append(run[cls])
        if not rows:
            continue
        n = rows[0][0]
        m, f, a = (statistics.median(r[k] for r in rows) / n * 1e3 for k in (1, 2, 3))
        print(f"{cls:>12} {n:>7} {m:>9.3f} {f:>9.3f} {a:>9.3f} {m / f:>10.1f}x")


SCRIPT = ("d = {}\n"
          "for i in range(10000): d[str(i)] = i * i\n"
          "print(sum(len(k) + v % 7 for k, v in d.items()))\n")


def record(main_dir: str, runs: int) -> int:
    work = tempfile.mkdtemp(prefix="bench-copier-")
    script = os.path.join(work, "script.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    native = subprocess.run(["/usr/bin/python3", "-S", script], capture_output=True).stdout
    trees = (("main", main_dir), ("this", ROOT))
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    status = 0
    try:
        for _ in range(runs):
            for name, tree in trees:
                spent = os.path.join(work, f"{name}.json")
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                done = subprocess.run(
                    [os.path.join(tree, ".venv", "bin", "python"), os.path.join(ROOT, "bench", "copy_timer.py"),
                     spent, "record", "--data", "--data-engine", "hybrid", "-o", os.path.join(work, "t"),
                     "--", "/usr/bin/python3", "-S", script], capture_output=True)
                wall = time.perf_counter() - t0
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                shutil.rmtree(os.path.join(work, "t"), ignore_errors=True)
                if done.returncode != 0 or done.stdout != native:
                    print(f"{name}: exit {done.returncode}, output {'equal' if done.stdout == native else 'DIFFERENT'}: "
                          f"{done.stderr.decode(errors='replace')[-500:]}")
                    status = 1
                    continue
                with open(spent) as f:
                    row = json.load(f)
                row["wall"] = wall
                row["cpu"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
                results[name].append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    print(f"== madtrace record --data --data-engine hybrid -- python3 -S (dict of 10000 keys): "
          f"median of {runs} runs, in turn; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'tree':>5} {'wall s':>8} {'cpu s':>8} {'copies':>7} {'copy s':>8} {'analyse s':>10} "
          f"{'of it cpu':>10} {'of it gc':>9} {'ms/copy':>8} {'cpu ms/copy':>12}   (min wall, min copy)")
    for name, rows in results.items():
        if not rows:
            continue
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        spent = [r["copy_function"] + r["analyse"] for r in rows]
        cpu = [r["copy_function_cpu"] + r["analyse_cpu"] for r in rows]
        copies = max(med["copies"], 1)
        print(f"{name:>5} {med['wall']:>8.1f} {med['cpu']:>8.1f} {med['copies']:>7.0f} "
              f"{med['copy_function']:>8.2f} {med['analyse']:>10.2f} {statistics.median(cpu):>10.2f} "
              f"{med['gc']:>9.2f} {statistics.median(spent) / copies * 1e3:>8.2f} "
              f"{statistics.median(cpu) / copies * 1e3:>12.2f}   "
              f"({min(r['wall'] for r in rows):.1f}, {min(spent):.2f})")
    return status


def main() -> int:
    args = sys.argv[1:]
    main_dir = args[args.index("--main") + 1] if "--main" in args else "/work/main"
    repeat = int(args[args.index("--repeat") + 1]) if "--repeat" in args else 3
    stride = int(args[args.index("--stride") + 1]) if "--stride" in args else 5
    if "--time-once" in args:
        print(json.dumps(time_once(main_dir, stride)))
        return 0
    status = 0
    if "--record" in args:
        return record(main_dir, int(args[args.index("--record") + 1]))
    if "--compare" in args or "--time" not in args:
        status = compare(main_dir)
    if "--time" in args:
        timing(main_dir, repeat, stride)
    return status


if __name__ == "__main__":
    sys.exit(main())
