"""The target's pause while instrumenting: what is done ahead, while
the target runs, must give the same result as what the stop did before."""

import os
import subprocess
from types import SimpleNamespace

import pytest

from madtrace.arch.x86_64 import relocate
from madtrace.binary.elf import ElfImage
from madtrace.calls.ahead import decode_ahead
from madtrace.calls.thread_pool import HOOKED

from .util import MADTRACE, ROOT, prog, summary_json

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def _functions(path, count):
    image = ElfImage.load(path)
    text = image.section(".text")
    chosen = {}
    for s in image.symbols:
        if s.kind == "FUNC" and s.size and text.address <= s.address < text.address + text.size:
            chosen.setdefault(s.address, s)
    fns = sorted(chosen.values(), key=lambda s: s.address)
    step = max(1, len(fns) // count)
    return [(image.read(s.address - text.address + text.offset, s.size), s.address, s.size)
            for s in fns[::step][:count]]


def _libpython():
    with open("/proc/self/maps") as f:
        for line in f:
            if "libpython" in line and ".so" in line:
                return line.split()[-1]
    return None


@pytest.mark.parametrize("path", [LIBC, _libpython() or LIBC, prog("calls_callbacks", "O2-nopie")],
                         ids=["libc", "libpython", "nopie"])
def test_prologue_decoded_ahead_relocates_as_a_fresh_decoding(path):
    """relocate_entry keeps each decoded prologue (relocate._prologues): decoded
    for one address (ahead), then relocated for another (in the stop), it gives
    what a decoding made for that address gives: code, notes, moved, refusals
    (branches out of rel32 range included)."""
    near = 0x10000000
    for code, address, size in _functions(path, 400):
        targets = [address + near, address - near if address > near else address + 2 * near,
                   address + (3 << 30)]          # the last: out of rel32 range for most
        for branches in (None, lambda lo, hi: []):
            fresh = []
            for at in targets:
                relocate._prologues.clear()
                fresh.append(relocate.relocate_entry(code, address, size, at, branches_into=branches))
            relocate._prologues.clear()
            relocate.relocate_entry(code, address, size, address, branches_into=branches)  # ahead
            again = [relocate.relocate_entry(code, address, size, at, branches_into=branches)
                     for at in targets]
            assert again == fresh, hex(address)


def test_decode_ahead_decodes_what_the_patching_relocates(tmp_path):
    """decode_ahead reads the prologues of the entry-patched functions (and the C
    library's fork/exec the ring pool hooks) from a running program: the
    patching then finds every one decoded."""
    target = subprocess.Popen([prog("bench_live", "O2-pie")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert target.stdout.readline() == b"ready\n"
        from madtrace.binary.address_space import AddressSpace
        from madtrace.binary.maps import read_maps
        from madtrace.process.memory import ProcessMemory
        with ProcessMemory(target.pid) as mem:
            space = AddressSpace.from_maps(read_maps(target.pid), mem.read, pid=target.pid,
                                           exe_path=os.readlink(f"/proc/{target.pid}/exe"))
            relocate._prologues.clear()
            n = decode_ahead(SimpleNamespace(mem=mem), space, ["leaf", "wrapper"], method="entry",
                             pool=True)
            hooks = [ms for name in HOOKED for ms in space.find_functions(name)
                     if ms.module.name == "libc.so.6" and ms.symbol.dynamic and ms.address]
            assert n == 2 + len({ms.address for ms in hooks}) and len(relocate._prologues) == n
            for ms in space.find_functions("leaf"):
                code = mem.read(ms.address, ms.symbol.size)
                before = len(relocate._prologues)
                assert relocate.relocate_entry(code, ms.address, ms.symbol.size, ms.address + 4096,
                                               branches_into=lambda lo, hi: [])
                assert len(relocate._prologues) == before          # found, not decoded again
    finally:
        target.kill()
        target.wait()


def test_attach_writes_its_files_once_the_target_runs(tmp_path):
    """meta.json, maps.start.txt and functions.json are written after the
    attach's resume (Controller.after_resume, FunctionTracer.after_stop), never
    left out; the drain thread starts then: every call after it is counted."""
    target = subprocess.Popen([prog("bench_live", "O2-pie")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    os.makedirs(tmp_path / "run", mode=0o700)
    env = dict(os.environ, PYTHONPATH=ROOT, XDG_RUNTIME_DIR=str(tmp_path / "run"))
    out = tmp_path / "t"

    def cli(*args):
        run = subprocess.run([*MADTRACE, *args], capture_output=True, timeout=120, env=env)
        assert run.returncode == 0, run.stderr
        return run
    try:
        assert target.stdout.readline() == b"ready\n"
        cli("daemon", str(target.pid), "-o", str(out), "-f", "wrapper")
        cli("ctl", str(target.pid), "status", "--json")
        assert (out / "meta.json").exists() and (out / "maps.start.txt").exists()
        assert (out / "functions.json").exists()
        target.stdin.write(b"calls 100000\n")
        target.stdin.flush()
        assert b"checksum" in target.stdout.readline()
        cli("ctl", str(target.pid), "stop")
        assert summary_json(out)["calls"]["wrapper"] == 100000
    finally:
        target.kill()
        target.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to pin")
def test_remote_syscalls_pin_and_give_back_both_cpu_masks():
    """A RemoteSyscalls scope runs the target's thread on the tracer's CPU (each
    call a switch on one CPU, not a wake-up on another) and gives both threads
    their own masks back when it ends, whatever the masks were."""
    from madtrace.process.remote_syscall import RemoteSyscalls
    from madtrace.process.tracee import Tracee
    target = subprocess.Popen([prog("bench_live", "O2-pie")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    mine = os.sched_getaffinity(0)
    tracee = None
    try:
        assert target.stdout.readline() == b"ready\n"
        os.sched_setaffinity(target.pid, set(sorted(mine)[-2:]))
        theirs = os.sched_getaffinity(target.pid)
        tracee = Tracee.attach(target.pid)
        with RemoteSyscalls(tracee) as rs:
            assert rs.getpid() == target.pid
            inside = os.sched_getaffinity(target.pid)
            assert len(inside) == 1 and inside == os.sched_getaffinity(0) and inside <= theirs
            assert rs.getpid() == target.pid
        assert os.sched_getaffinity(target.pid) == theirs and os.sched_getaffinity(0) == mine
        tracee.resume_all()
        tracee.detach()
        tracee = None
        target.stdin.write(b"calls 1000\n")
        target.stdin.flush()
        assert b"checksum" in target.stdout.readline()
    finally:
        if tracee is not None:
            tracee.detach()
        os.sched_setaffinity(0, mine)
        target.kill()
        target.wait()
