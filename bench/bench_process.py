"""Injected-syscall round trip and target-memory read
throughput, madtrace's process layer side by side with python-ptrace's own
calls, on the same target in one run (ratios matter; absolute numbers drift).

Both tracers attach in turn to one target blocked in read(); each is measured
with tracer and target on the same CPU and on different CPUs (pitfall 1)."""

from __future__ import annotations

import os
import signal
import subprocess

from common import best_of, prog, table

from madtrace.process.remote_syscall import RemoteSyscalls
from madtrace.process.tracee import Tracee

N_SYSCALLS = 2000
READ_SIZES = (16, 4096, 1 << 20)


def start_target():
    proc = subprocess.Popen([prog("blocking"), "read"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    return proc


def heap_range(pid):
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "rw-p" in line and ("[heap]" in line or line.split()[-1].startswith("/") is False):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if hi - lo >= (1 << 20) or "[heap]" in line:
                    return lo, hi
    raise RuntimeError("no writable mapping")


def pin(pid, same: bool):
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    os.sched_setaffinity(pid, {cpus[0] if same or len(cpus) == 1 else cpus[1]})


def bench_madtrace(pid, same_cpu):
    pin(pid, same_cpu)
    tracee = Tracee.attach(pid)
    with RemoteSyscalls(tracee) as rs:
        t = best_of(lambda: [rs.getpid() for _ in range(N_SYSCALLS)], 3) / N_SYSCALLS
    reads = {}
    lo, hi = map_for_reads(pid)
    for size in READ_SIZES:
        n = max(1, min(2000, (64 << 20) // size))
        size_ok = min(size, hi - lo)
        reads[size] = size_ok * n / best_of(lambda n=n, size_ok=size_ok: [tracee.mem.read(lo, size_ok) for _ in range(n)], 3)
    tracee.detach()
    return t, reads


def map_for_reads(pid):
    best = None
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if line.split()[1].startswith("r") and "[vvar" not in line and "[vsyscall" not in line:
                if best is None or hi - lo > best[1] - best[0]:
                    best = (lo, hi)
    return best


def bench_python_ptrace(pid, same_cpu):
    from ptrace.debugger import PtraceDebugger
    pin(pid, same_cpu)
    debugger = PtraceDebugger()
    process = debugger.addProcess(pid, False)
    gadget = Tracee.auxv_entry(type("T", (), {"pid": pid})())
    saved_code = process.readBytes(gadget, 3)
    process.writeBytes(gadget, b"\x0f\x05\xcc")
    saved = process.getregs()

    def one_syscall():
        regs = process.getregs()
        regs.rax, regs.orig_rax, regs.rip = 39, 0xFFFFFFFFFFFFFFFF, gadget
        process.setregs(regs)
        process.cont()
        process.waitSignals(signal.SIGTRAP)
        result = process.getregs().rax
        process.setregs(saved)
        return result

    assert one_syscall() == pid
    t = best_of(lambda: [one_syscall() for _ in range(N_SYSCALLS // 4)], 3) / (N_SYSCALLS // 4)
    process.writeBytes(gadget, saved_code)
    process.setregs(saved)
    reads = {}
    lo, hi = map_for_reads(pid)
    for size in READ_SIZES:
        n = max(1, min(200, (4 << 20) // size))
        size_ok = min(size, hi - lo)
        reads[size] = size_ok * n / best_of(lambda n=n, size_ok=size_ok: [process.readBytes(lo, size_ok) for _ in range(n)], 3)
    process.detach()
    debugger.quit()
    return t, reads


def main():
    proc = start_target()
    rows = []
    results = {}
    try:
        for same in (True, False):
            where = "same CPU" if same else "other CPU"
            results[("madtrace", same)] = bench_madtrace(proc.pid, same)
            results[("python-ptrace", same)] = bench_python_ptrace(proc.pid, same)
            m, p = results[("madtrace", same)], results[("python-ptrace", same)]
            rows.append((where, f"{m[0] * 1e6:.1f}", f"{p[0] * 1e6:.1f}", f"{p[0] / m[0]:.2f}x"))
        print(table("injected syscall round trip (getpid), us per call", rows,
                    ("placement", "madtrace", "python-ptrace", "speed-up")))
        rows = []
        m, p = results[("madtrace", True)][1], results[("python-ptrace", True)][1]
        for size in READ_SIZES:
            rows.append((size, f"{m[size] / 1e6:.1f}", f"{p[size] / 1e6:.2f}", f"{m[size] / p[size]:.0f}x"))
        print(table("target memory reads, MB/s (same CPU)", rows,
                    ("bytes/read", "madtrace", "python-ptrace", "speed-up")))
        out, _ = proc.communicate(b"still works\n", timeout=30)
        assert out == b"got 12 bytes: still works\n", out
        print("target output after both tracers detached: unchanged")
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
