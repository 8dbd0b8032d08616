"""Instrumenting a live, attached target in short stops
(calls/staging.py): the areas are mapped in a brief stop of their own, the
trampolines written while the target runs, and the command's stop only
writes the jumps.  The result must be what one long stop gave: exact counts,
the same checks, nothing left behind."""

import re
import subprocess
import time

import pytest

from madtrace.binary.address_space import AddressSpace
from madtrace.calls.engine import FunctionTracer
from madtrace.calls.staging import stage
from madtrace.process.tracee import Tracee

from .test_daemon import ctl_json, run, runtime  # noqa: F401 (a fixture)
from .util import check_live_output, finish_live, prog, start_ready, summary_json


def _attached(runtime, variant: str, out) -> subprocess.Popen:  # noqa: F811
    """bench_live, ready, with a daemon attached that traces nothing yet."""
    target = subprocess.Popen([prog("bench_live", variant)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert target.stdout.readline() == b"ready\n"
        result = run(runtime, "daemon", str(target.pid), "-o", str(out), "--no-functions", "-q")
        assert result.returncode == 0, result.stderr
    except BaseException:
        target.kill()
        target.wait()
        raise
    return target


def _stop_and_quit(runtime, target) -> None:  # noqa: F811
    """The daemon stopped, then the program told to quit: it ends well."""
    result = run(runtime, "ctl", str(target.pid), "stop")
    assert result.returncode == 0, result.stderr
    target.stdin.write(b"quit\n")
    target.stdin.flush()
    assert target.wait(timeout=60) == 0


def _calls(target, n: int) -> None:
    target.stdin.write(f"calls {n}\n".encode())
    target.stdin.flush()
    assert re.match(rb"calls \d+ checksum", target.stdout.readline())


@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_attached_instrument_stops_to_map_then_to_patch_and_counts_exactly(
        tmp_path, runtime, variant):  # noqa: F811
    """A first `instrument` stops the target twice (the areas, then the jumps);
    a second one, with room left in its code area, once.  Every call made
    after each reply is counted, and the ring pool's hooks are in place."""
    out = tmp_path / "t"
    target = _attached(runtime, variant, out)
    try:
        first = ctl_json(runtime, target.pid, "instrument", "wrapper")
        assert [p["function"] for p in first["patched"]] == ["wrapper"]
        status = ctl_json(runtime, target.pid, "status")
        assert len(status["last_stops_ms"]) == 2
        assert status["last_pause_ms"] == max(status["last_stops_ms"])
        # when: the attach, then these two stops, on CLOCK_MONOTONIC, in order
        windows = status["stop_windows"]
        assert len(windows) == 3 and all(a < b for a, b in windows)
        assert all(windows[i][1] <= windows[i + 1][0] for i in range(2))
        assert [round((b - a) * 1000, 3) for a, b in windows[1:]] == status["last_stops_ms"]
        assert windows[-1][1] <= time.monotonic()
        assert status["ring_pool"]["on"] and status["ring_pool"]["hooks"] >= 2
        _calls(target, 100_000)
        second = ctl_json(runtime, target.pid, "instrument", "leaf")
        assert [p["function"] for p in second["patched"]] == ["leaf"]
        assert len(ctl_json(runtime, target.pid, "status")["last_stops_ms"]) == 1
        _calls(target, 50_000)
        _stop_and_quit(runtime, target)
    finally:
        target.kill()
        target.wait()
    calls = summary_json(out)["calls"]
    assert calls["wrapper"] == 150_000 and calls["leaf"] == 50_000


def test_daemon_f_instruments_after_the_attach_in_short_stops(tmp_path, runtime):  # noqa: F811
    """`daemon PID -f F` attaches, then its live session instruments F as
    `instrument` does (two stops, none of them the attach's)."""
    target = subprocess.Popen([prog("bench_live", "O2-pie")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    out = tmp_path / "t"
    try:
        assert target.stdout.readline() == b"ready\n"
        result = run(runtime, "daemon", str(target.pid), "-o", str(out), "-f", "leaf", "-q")
        assert result.returncode == 0, result.stderr
        status = ctl_json(runtime, target.pid, "status")
        assert status["functions_instrumented"] == 1 and len(status["last_stops_ms"]) == 2
        _calls(target, 70_000)
        assert run(runtime, "ctl", str(target.pid), "stop").returncode == 0
    finally:
        target.kill()
        target.wait()
    assert summary_json(out)["calls"]["leaf"] == 70_000


def _stopped_for(tracee):
    """A live session's brief stop, as LiveSession.stop_for makes it."""
    def stop_for(work):
        tracee.stop_all()
        try:
            work()
        finally:
            tracee.resume_all()
    return stop_for


def test_code_changed_after_staging_is_not_patched(tmp_path):
    """The trampolines are built from the code as it was while the target ran;
    a function whose first bytes changed before the patching is refused with
    its reason (never patched over), the others are patched, and the program
    ends as an untraced run does."""
    argv = [prog("live_calls", "O2-pie")]
    proc = start_ready(argv)      # runs until its stdin is closed
    try:
        tracee = Tracee.attach(proc.pid)
        space = AddressSpace.from_pid(proc.pid)
        engine = FunctionTracer(tracee, space, str(tmp_path))
        tracee.resume_all()
        staged = stage(engine, ["tick", "tock"], _stopped_for(tracee), pool=False)
        assert {fn.name for fn in staged.functions} == {"tick", "tock"}
        tracee.stop_all()
        tick = next(fn for fn in engine.plan.functions if fn.name == "tick")
        # the first bytes tick's first patch replaces, changed after its trampoline was built
        changed = engine.plan.sites[tick.site_ids[0]].address
        original = tracee.mem.read(changed, 1)
        tracee.mem.write(changed, b"\xcc")
        report = engine.install(["tick", "tock"])
        tracee.mem.write(changed, original)
        assert [p["function"] for p in report["patched"]] == ["tock"]
        assert any(s["what"] == "tick" and "not what was analysed" in s["why"]
                   for s in report["skipped"])
        assert tracee.mem.read(changed, 1) == original
        tracee.on_new_thread.append(engine.register_thread)
        tracee.resume_all()
        engine.after_stop()              # the drain starts (attached)
        tracee.stop_all()
        engine.detach()
        tracee.detach()
        out = finish_live(proc)
    finally:
        proc.kill()
    check_live_output(argv[0], out)
    assert proc.returncode == 0


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def _rings_resident(pid: int) -> int:
    """Bytes of madtrace's ring mappings in the process's page tables."""
    total, in_rings = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                in_rings = "madtrace-rings" in line
            elif in_rings and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def test_attached_rings_are_mapped_in_the_target_before_its_first_records(
        tmp_path, runtime):  # noqa: F811
    """Once `instrument` let the target run, madtrace maps its ring's pages in the
    target's page tables (a read of each through /proc/PID/mem): the thread's first
    4 MB of records take no page fault.  They took 1034, 5-20 ns more per call over
    a first burst in a VM."""
    out = tmp_path / "t"
    target = _attached(runtime, "O2-pie", out)
    try:
        ctl_json(runtime, target.pid, "instrument", "leaf")
        deadline = time.monotonic() + 30
        while _rings_resident(target.pid) < 4 << 20:     # mapped once the stop is over
            assert time.monotonic() < deadline, _rings_resident(target.pid)
            time.sleep(0.05)
        before = _minor_faults(target.pid)
        _calls(target, 200_000)         # 400 000 records: the whole ring, and around again
        assert _minor_faults(target.pid) - before < 100
        assert ctl_json(runtime, target.pid, "status")["dropped_events"] == 0
        _stop_and_quit(runtime, target)
    finally:
        target.kill()
        target.wait()
    assert summary_json(out)["calls"]["leaf"] == 200_000
