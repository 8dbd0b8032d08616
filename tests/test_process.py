"""Process control on real programs: launch, attach, remote syscalls, detach.

Oracles: the program's own output and exit status, untraced vs traced."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

import pytest

from madtrace.errors import NoSuchProcessError
from madtrace.process.cpu import SameCpu
from madtrace.process.remote_syscall import (MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE,
                                             RemoteSyscalls)
from madtrace.process import ptrace_raw as pr
from madtrace.process.events import SignalStop, keep_signal
from madtrace.process.tracee import Tracee

from .util import VARIANTS, prog, read_line, run_untraced, start_ready, wait_in_syscall


def test_launch_stops_at_entry_and_runs_to_exit():
    """The launch reaches the entry point through the loader's jump to a stub
    (process/entry_start.py): stopped there, the stub's page gone, no system
    call tracing left on; the program then runs to its own end."""
    tracee = Tracee.spawn([prog("signals", "O0-pie"), "die", "6"])
    from madtrace.process.controller import Controller
    controller = Controller(tracee)
    entry = tracee.auxv_entry()
    maps_before = set(open(f"/proc/{tracee.pid}/maps").read().splitlines())
    controller.run_to_entry()
    assert tracee.get_regs().rip == entry
    assert not tracee.trace_syscalls
    anonymous_code = [line for line in open(f"/proc/{tracee.pid}/maps").read().splitlines()
                      if line not in maps_before and " r-xp " in line and len(line.split()) == 5]
    assert anonymous_code == [], anonymous_code
    assert controller.run() == "exited"
    assert tracee.exit_event.signum == signal.SIGABRT


@pytest.mark.parametrize("variant", VARIANTS)
def test_remote_syscalls_in_working_threads_then_detach(variant):
    """Attach to a multi-threaded program while it works, run 1000 injected
    syscalls (getpid, mmap/munmap), detach: its output is byte-identical."""
    argv = [prog("threads", variant), "4", "60000000", "ready"]
    expected = run_untraced(argv, input=b"go\n").stdout
    proc = start_ready(argv)
    try:
        tracee = Tracee.attach(proc.pid)
        assert len(tracee.threads) == 5
        calls = 0
        with SameCpu(list(tracee.threads)):
            for _round in range(10):
                with RemoteSyscalls(tracee, proc.pid) as rs:
                    for _ in range(50):
                        assert rs.getpid() == proc.pid
                        addr = rs.mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
                        tracee.mem.write(addr, b"madtrace")
                        assert tracee.mem.read(addr, 8) == b"madtrace"
                        rs.munmap(addr, 8192)
                        calls += 3
                tracee.resume_all()
                time.sleep(0.01)
                for event in tracee.stop_all():
                    pytest.fail(f"unexpected event while working: {event}")
        assert calls >= 1000
        tracee.detach()
        out, _ = proc.communicate(b"go\n", timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert b"ready\n" + out == expected


def test_registers_restored_exactly_after_remote_syscalls():
    proc = start_ready([prog("blocking", "O2-pie"), "read"])
    try:
        wait_in_syscall(proc.pid, 0)
        tracee = Tracee.attach(proc.pid)
        before = tracee.get_regs()
        # stopped inside read(): rax holds -ERESTARTSYS, orig_rax the syscall number
        assert before.orig_rax == 0
        with RemoteSyscalls(tracee) as rs:
            rs.getpid()
            rs.munmap(rs.mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS), 4096)
        assert tracee.get_regs() == before
        tracee.detach()
        out, _ = proc.communicate(b"hello\n", timeout=30)
    finally:
        proc.kill()
    assert out == b"got 6 bytes: hello\n"


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-pie"])
def test_blocked_nanosleep_completes_after_detach(variant):
    proc = start_ready([prog("blocking", variant), "sleep", "1200"])
    try:
        wait_in_syscall(proc.pid, 230)  # clock_nanosleep
        tracee = Tracee.attach(proc.pid)
        with RemoteSyscalls(tracee) as rs:
            for _ in range(20):
                rs.getpid()
        tracee.detach()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out == b"slept 1200\n"
    assert proc.returncode == 0


def test_attach_no_such_pid():
    with pytest.raises(NoSuchProcessError):
        Tracee.attach(4_000_000)


def test_detach_keeps_pending_signals_of_the_target():
    """A signal that arrives while madtrace holds the threads is delivered after detach."""
    proc = start_ready([prog("blocking", "O0-pie"), "read"])
    try:
        tracee = Tracee.attach(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)
        tracee.resume_all()
        for _ in range(50):  # the SIGTERM shows up as a signal-delivery-stop, kept pending
            tracee.stop_all_quietly()
            if tracee.threads[proc.pid].pending_signal:
                break
            tracee.resume_all()
            time.sleep(0.01)
        assert tracee.threads[proc.pid].pending_signal == signal.SIGTERM
        tracee.detach()
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM


# the main thread queues itself a SIGSEGV as the kernel's fault would (si_code
# SEGV_ACCERR), blocked for now, then waits for a line
QUEUED_FAULT = r"""
import ctypes, os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGSEGV})
info = (ctypes.c_int * 32)()
info[0], info[2] = signal.SIGSEGV, 2
ctypes.c_uint64.from_address(ctypes.addressof(info) + 16).value = 0x1000
libc = ctypes.CDLL(None, use_errno=True)
if libc.syscall(297, os.getpid(), os.getpid(), signal.SIGSEGV, info) != 0:
    sys.exit(f"rt_tgsigqueueinfo: errno {ctypes.get_errno()}")
print("ready", flush=True)
sys.stdin.readline()
print("alive", flush=True)
"""
PTRACE_SETSIGMASK = 0x420B


@pytest.mark.parametrize("take", [True, False], ids=["taken", "left"])
def test_a_fault_queued_behind_an_interrupt_trap_is_not_delivered_at_detach(take):
    """A thread that faults (or hits an int3) just before a PTRACE_INTERRUPT
    reaches the interrupt's trap with the fault's SIGSEGV queued: the kernel takes
    a pending trap before it dequeues a signal.  Detached from that trap, the
    thread got the SIGSEGV untraced, its page long open again: a live http.server
    died so (SIGSEGV at the detach, no dmesg line; SIGTRAP for an int3).  The race
    made certain: the target queues the signal itself while blocking it, the
    tracer unblocks it at the trap (PTRACE_SETSIGMASK).  ``take_queued_signals``
    (the detach's) brings the thread to that signal's delivery stop, where it is
    a fault to run again, not delivered; ``left``: the death without it."""
    proc = subprocess.Popen([sys.executable, "-c", QUEUED_FAULT],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert read_line(proc) == b"ready\n"
        tracee = Tracee.attach(proc.pid)
        tid = proc.pid
        assert [i.si_signo for i in pr.queued_signals(tid)] == [signal.SIGSEGV]
        mask = ctypes.c_uint64(pr.get_sigmask(tid) & ~(1 << (signal.SIGSEGV - 1)))
        pr.ptrace(PTRACE_SETSIGMASK, tid, 8, ctypes.cast(ctypes.byref(mask), ctypes.c_void_p))
        if take:
            events = tracee.take_queued_signals()
            assert [(type(e), e.signum, e.si_code, e.si_addr) for e in events] == \
                [(SignalStop, signal.SIGSEGV, 2, 0x1000)]
            keep_signal(tracee.threads[tid], events[0])
            assert tracee.threads[tid].pending_signal == 0     # a fault: it comes again
        tracee.detach()
        out, _ = proc.communicate(b"go\n", timeout=30)
    finally:
        proc.kill()
        proc.wait()
    if take:
        assert (proc.returncode, out) == (0, b"alive\n")
    else:
        assert proc.returncode == -signal.SIGSEGV


# pushfq; int3; popfq; nop; nop; ret in executable memory, called once a line is read
POPF_STEPS = r"""
import ctypes, mmap, sys
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(b"\x9c\xcc\x9d\x90\x90\xc3")
code = ctypes.addressof(ctypes.c_char.from_buffer(buf))
print(code, flush=True)
sys.stdin.readline()
ctypes.CFUNCTYPE(None)(code)()
print("alive", flush=True)
"""


def test_stepping_over_a_popfq_leaves_no_trap_flag_at_detach():
    """Stepping a popfq makes the kernel take the trap flag for the program's,
    and each later step keeps it so: detached, the thread died of SIGTRAP one
    instruction later (an http.server detached with a thread in a jump stub
    past its pushfq, which probe_settle steps out: si_code TRAP_TRACE, TF set,
    rip one instruction after the jump's target).  step_until_out over
    ``popfq; nop; nop`` here, then detach: the program goes on."""
    from madtrace.target.mappings import step_until_out

    class Range:
        def __init__(self, start, end):
            self.start, self.end = start, end

        def contains(self, address):
            return self.start <= address < self.end

    proc = subprocess.Popen([sys.executable, "-c", POPF_STEPS],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        code = int(read_line(proc))
        tracee = Tracee.attach(proc.pid)
        tracee.resume_all()
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        event = tracee.wait_event(block=True, tid=proc.pid)
        assert isinstance(event, SignalStop) and event.signum == signal.SIGTRAP
        assert tracee.get_regs(proc.pid).rip == code + 2          # after the int3
        assert step_until_out(tracee, proc.pid, Range(code + 2, code + 5))
        assert tracee.get_regs(proc.pid).rip == code + 5          # at the ret
        tracee.detach()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert (proc.returncode, out) == (0, b"alive\n")


# a loop in executable memory (inc rax; jmp back), entered once a line is read
SPIN = r"""
import ctypes, mmap, sys
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(b"\x48\xff\xc0\xeb\xfb")
code = ctypes.addressof(ctypes.c_char.from_buffer(buf))
print(code, flush=True)
sys.stdin.readline()
ctypes.CFUNCTYPE(None)(code)()
"""


def _traced_stop(tid: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(f"/proc/{tid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "t":
                return
        time.sleep(0.001)
    raise AssertionError(f"thread {tid} never stopped")


@pytest.mark.parametrize("stepper", ["probe_settle", "step"])
def test_a_step_after_a_stop_request_runs_its_instruction(stepper):
    """A stop request (SIGTERM: ``Controller.request_stop``) interrupts a
    running thread; when the thread reaches that trap before the detach's
    ``stop_all`` reaps it, stop_all interrupts it again, and the kernel keeps
    that second interrupt for the thread's next resume.  The detach's first
    single step then came back with its trap and nothing run: the probe
    settler took it for the step of a probe's access and moved the thread on
    without it (data_dispatch -O0 detached mid-run called ``x`` instead of its
    op: SIGSEGV, no output; madtrace exited 0).  The sequence made certain
    here: the thread is seen in its trap stop before stop_all.  A step must
    run one instruction of ``inc rax; jmp back``."""
    from types import SimpleNamespace

    from madtrace.data.hybrid.probe_settle import ProbeSettler
    from madtrace.process.controller import Controller
    from madtrace.process.stepping import step

    proc = subprocess.Popen([sys.executable, "-c", SPIN],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        code = int(read_line(proc))
        tracee = Tracee.attach(proc.pid)
        tid = proc.pid
        controller = Controller(tracee)
        tracee.resume_all()
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        time.sleep(0.2)
        controller.request_stop("SIGTERM")       # the signal handler's interrupt
        _traced_stop(tid)                        # its trap reached, not reaped yet
        assert tracee.stop_all() == []           # interrupts it again
        before = tracee.get_regs(tid).rip
        assert before in (code, code + 3)
        if stepper == "probe_settle":
            after = ProbeSettler(SimpleNamespace(tracee=tracee))._step(tid).rip
        else:
            step(tracee, tid)
            after = tracee.get_regs(tid).rip
        assert after == {code: code + 3, code + 3: code}[before]
        tracee.detach()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("variant", ["O2-nopie"])
def test_threads_made_while_every_thread_is_held_are_resumed(capfd, variant):
    """A program creates and joins a thread per round (and forks, vforks) while
    the tracer holds every thread again and again, as the data engines do
    (an entry redirected, the slow path) and resumes what it stopped
    (``Tracee.hold_all``).  A thread whose parent's clone event is met during
    such a hold is stopped by it at its first stop, and must be resumed with
    the others: before, only the threads seen running before the hold were,
    the new one stayed stopped and pthread_join waited forever (the hybrid
    engine's rare hang of the mutex program).  The program's output equals its
    untraced one."""
    from madtrace.process.controller import Controller

    argv = [prog("churn", variant), "300"]
    expected = run_untraced(argv).stdout
    capfd.readouterr()
    tracee = Tracee.spawn(argv)
    controller = Controller(tracee)
    deadline = time.monotonic() + 90
    holds = 0

    def hold():
        nonlocal holds
        if time.monotonic() > deadline:
            stopped = [t for t, s in tracee.threads.items() if not s.running]
            raise TimeoutError(f"the program hangs after {holds} holds; stopped threads {stopped}")
        events, held = tracee.hold_all()
        controller.deferred.extend(events)
        for tid in held:
            tracee.resume(tid)
        holds += 1

    controller.command_poll = hold
    try:
        assert controller.run() == "exited"
    finally:
        if tracee.threads:
            os.kill(tracee.pid, signal.SIGKILL)
    assert tracee.exit_event.status == 0 and holds > 100
    assert capfd.readouterr().out.encode() == expected


def test_a_failed_restore_leaves_madtraces_areas_in_place():
    """A restore that fails at detach (an engine's before_detach hook raises) leaves
    madtrace's areas mapped, as a dead tracer would (a patch or a protected page
    may still lead there), says so, and still detaches: the release hooks are
    not run, and the program finishes as an untraced run does."""
    from madtrace.process.controller import Controller
    from .util import check_live_output, finish_live
    argv = [prog("live_calls", "O2-pie")]
    proc = start_ready(argv)          # runs until its stdin is closed
    released = []
    try:
        tracee = Tracee.attach(proc.pid)
        controller = Controller(tracee)

        def failing(t):
            raise RuntimeError("injected")
        controller.hooks(tracee).before_detach.append(failing)
        controller.hooks(tracee).release.append(released.append)
        tracee.resume_all()
        time.sleep(0.1)
        controller.detach_all()
        out = finish_live(proc)
    finally:
        proc.kill()
    assert released == []
    assert any("restoring: RuntimeError: injected" in f for f in controller.detach_failures)
    assert any("areas stay mapped" in f for f in controller.detach_failures)
    check_live_output(argv[0], out)
    assert proc.returncode == 0


def test_patches_covering_a_range_equal_a_walk_of_every_patch():
    """``PatchSet.covering`` (short ranges by lookups, wide ones by a binary
    search in the sorted addresses) against a walk of every applied patch,
    with patches applied, reverted, deleted and cleared by their owners."""
    import random

    from madtrace.target.patchset import Patch, PatchSet

    class Memory:
        def __init__(self):
            self.bytes = bytearray(1 << 16)

        def read(self, address, size):
            return bytes(self.bytes[address:address + size])

        def write(self, address, data):
            self.bytes[address:address + len(data)] = data

    rng = random.Random(7)
    mem, patches = Memory(), PatchSet()
    for round_ in range(300):
        free = [a for a in range(64, 60000, 13) if not patches.covering(a, a + 13)]
        made = []
        for address in rng.sample(free, 5):
            size = rng.choice((1, 5, 8, 13))
            made.append(Patch(address, mem.read(address, size), bytes([0xCC]) * size, "test"))
        patches.apply(mem, made, [])
        if round_ % 7 == 3:
            patches.revert(mem, rng.sample(sorted(patches.applied), 3))
        if round_ % 11 == 5:
            for address in rng.sample(sorted(patches.applied), 2):
                del patches.applied[address]
        if round_ == 150:
            patches.applied.clear()
        for _ in range(20):
            lo = rng.randrange(0, 60000)
            hi = lo + rng.choice((1, 5, 40, 300, 5000))
            want = sorted((p for p in patches.applied.values() if p.address < hi and p.end > lo),
                          key=lambda p: p.address)
            assert patches.covering(lo, hi) == want, (lo, hi)


def test_code_areas_stay_inside_the_user_address_space_without_aslr():
    """``setarch -R`` (gdb's default) puts the libraries just below the main
    stack: an area within reach of libc was placed above the user address
    space (mmap: ENOMEM, every data recording failed).  It lies inside it now,
    clear of the stack's room to grow and of the brk heap's."""
    from madtrace.binary.maps import Mapping
    from madtrace.target.areas import HEAP_GROWTH_ROOM, USER_TOP, find_gap_near, gap_for_module

    def m(start, end, path=""):
        return Mapping(start, end, "r-xp", 0, "00:00", 0, path)

    maps = [m(0x555555554000, 0x555555559000, "/prog"), m(0x7ffff7dd1000, 0x7ffff7fb3000, "libc"),
            m(0x7ffff7fca000, 0x7ffff7fff000, "ld.so"), m(0x7ffffffde000, 0x7ffffffff000, "[stack]"),
            m(0xffffffffff600000, 0xffffffffff601000, "[vsyscall]")]
    brk, room = 0x555555559000, 8 << 20
    for lo, hi in ((0x7ffff7dd1000, 0x7ffff7fb3000), (0x555555554000, 0x555555559000)):
        for size in (0x10000, 0x4000000):
            at = find_gap_near(maps, lo, hi, size, brk, room)
            assert at + size <= USER_TOP
            assert not any(x.start < at + size and at < x.end for x in maps), hex(at)
            assert at + size <= 0x7ffffffde000 - room or at >= 0x7ffffffff000
            assert at + size <= brk or at >= brk + HEAP_GROWTH_ROOM
            assert abs(at - lo) < 1 << 31 and abs(at + size - hi) < 1 << 31
    # a live process's start_brk and stack limit are read
    proc = subprocess.Popen(["sleep", "5"])
    try:
        time.sleep(0.1)
        at = gap_for_module(proc.pid, 0x555555554000, 0x555555559000, 0x10000)
        assert 0 < at < USER_TOP
    finally:
        proc.kill()
        proc.wait()
