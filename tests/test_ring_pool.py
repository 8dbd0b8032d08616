# SPDX-License-Identifier: GPL-2.0-or-later
"""Threads made while a live session has functions instrumented: the ring pool
(calls/thread_pool.py, rings/ring_pool.py).  They are not traced (TracerPid
0), make no ptrace stop (the daemon handles no event while they come and go),
and every call they make is counted, in their own record files, while glibc
gives each the TCB of the one before (threads joined in a loop) or a new one.
Untraced threads that fork or exec are traced first: the fork child is
cleaned (no madtrace mapping in it, its calls not counted), the exec is
followed.  A SIGKILLed daemon leaves a working target that the next session
cleans.  Oracles: tests/progs/pool_threads' and thread_server's own counts
and answers, TracerPid, /proc/PID/maps, the record files read back."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from madtrace.trace.reader import iter_call_chunks

from .test_daemon import ctl_until, run, start_daemon, wait_gone
from .test_live_threads import ask, expected_sum, tracer_of
from .util import madtrace_maps, prog, read_line


class Program:
    """tests/progs/pool_threads, driven line by line."""

    def __init__(self, variant: str):
        self.proc = subprocess.Popen([prog("pool_threads", variant)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        assert read_line(self.proc) == b"ready\n"
        self.pid = self.proc.pid

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        return read_line(self.proc, timeout=120).decode().strip()


def ctl(runtime: str, pid: int, *words: str):
    result = run(runtime, "ctl", str(pid), *words)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout) if "--json" in words else result.stdout


HOOKED = ("fork", "_Fork", "execve", "execveat")


def libc_code(pid: int) -> dict[str, tuple[bytes, bytes]]:
    """(bytes in the process, bytes in the file) of the first 16 bytes of each
    function the ring pool hooks (nm -D gives their offsets; the maps, the base)."""
    with open(f"/proc/{pid}/maps") as f:
        lines = [line.split() for line in f if line.rstrip().endswith("/libc.so.6")]
    path = lines[0][5]
    base = min(int(fields[0].split("-")[0], 16) - int(fields[2], 16) for fields in lines)
    nm = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True).stdout
    out = {}
    with open(f"/proc/{pid}/mem", "rb") as mem, open(path, "rb") as elf:
        for name in HOOKED:
            found = re.search(rf"^([0-9a-f]+) [TW] {name}(@@\S+)?$", nm, re.M)
            if found is None:
                continue
            offset = int(found.group(1), 16)      # libc's text: file offset == address
            mem.seek(base + offset)
            elf.seek(offset)
            out[name] = (mem.read(16), elf.read(16))
    return out


def work_records(directory) -> dict[int, int]:
    """Entry records of work() per thread, from the record files."""
    with open(os.path.join(directory, "functions.json")) as f:
        work = {s["sid"] for s in json.load(f)["sites"] if s["function"] == "work"}
    out: dict[int, int] = {}
    for tid, chunk in iter_call_chunks(str(directory)):
        codes = chunk["code"]
        out[tid] = out.get(tid, 0) + sum(1 for c in codes if not c & 1 and int(c) >> 1 in work)
    return out


@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_new_threads_take_rings_without_stopping_and_every_call_counts(tmp_path, variant):
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    program = Program(variant)
    try:
        daemon = start_daemon(runtime, program.pid, tmp_path / "t")
        ctl(runtime, program.pid, "instrument", "work")
        before = ctl(runtime, program.pid, "status", "--json")
        assert before["ring_pool"]["on"], before["ring_pool"]
        waiting = program.ask("wait")          # a thread made now: untraced while it lives
        assert tracer_of(int(waiting.split()[1])) == 0
        assert program.ask("go") == "gone"
        joined = program.ask("join 300 7")      # each gets the TCB of the one before
        assert re.fullmatch(r"joined 300 calls 2100 sum \d+", joined), joined
        after = ctl(runtime, program.pid, "status", "--json")
        calls = ctl(runtime, program.pid, "calls", "--json")
        assert calls == {"work": 2 + 2100}
        assert after["tracer_events"] == before["tracer_events"]     # no ptrace stop at all
        assert after["threads"] == [program.pid]                     # none traced but the main one
        assert after["dropped_events"] == 0
        pool = after["ring_pool"]
        assert pool["claimed"] + pool["taken_over"] == 301 and pool["taken_over"] > 0, pool
        assert ctl(runtime, program.pid, "stop")
        wait_gone(daemon)
        assert madtrace_maps(program.pid) == []
        assert program.ask("quit") == "total 2102"
        assert program.proc.wait(timeout=60) == 0
    finally:
        program.proc.kill()
    per_thread = work_records(tmp_path / "t")
    # each thread's calls in its own file, though most took the ring of the one before
    assert sorted(per_thread.values()) == [2] + [7] * 300, sorted(per_thread.values())[:10]


def test_fork_and_exec_from_threads_made_after_instrument(tmp_path):
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    program = Program("O2-pie")
    try:
        daemon = start_daemon(runtime, program.pid, tmp_path / "t", how=("daemon", "-f", "work"))
        # daemon -f instruments once the attach's stop is over, after the command returned:
        # a thread made before the instrument's stops is traced by them (its fork is then
        # not one seized before it), so the forks wait for the pool
        ctl_until(runtime, program.pid, ["status"], lambda s: s["ring_pool"]["on"])
        # the forking thread is untraced until it forks: it asks to be traced first; the
        # child has no madtrace mapping (its exit status counts them) and its own calls
        # are not ours
        for _ in range(3):
            forked = program.ask("fork 9")
            assert re.fullmatch(r"forked \d+ status 0 calls 9", forked), forked
        status = ctl(runtime, program.pid, "status", "--json")
        assert status["ring_pool"]["seized_before_fork_or_exec"] == 3
        assert ctl(runtime, program.pid, "calls", "--json") == {"work": 27}
        # an untraced thread's exec is followed: the new image is traced in exec.1, its
        # -f functions instrumented at its entry, its new threads untraced again
        assert program.ask("exec") == "execd"
        assert re.fullmatch(r"joined 20 calls 60 sum \d+", program.ask("join 20 3"))
        status = ctl(runtime, program.pid, "status", "--json")
        assert status["ring_pool"]["on"] and status["dropped_events"] == 0, status
        assert ctl(runtime, program.pid, "calls", "--json") == {"work": 60}
        hooked = libc_code(program.pid)
        assert {"fork", "execve"} <= set(hooked) and all(now != file for now, file in hooked.values())
        assert ctl(runtime, program.pid, "stop")
        wait_gone(daemon)
        assert madtrace_maps(program.pid) == []
        assert all(now == file for now, file in libc_code(program.pid).values())   # restored
        assert program.ask("quit") == "total 60"
        assert program.proc.wait(timeout=60) == 0
    finally:
        program.proc.kill()
    with open(tmp_path / "t" / "meta.json") as f:
        meta = json.load(f)
    assert [image.get("outcome") for image in meta["images"]] == ["exec", "detached"]
    assert sum(work_records(tmp_path / "t").values()) == 27 + 1     # the exec'ing thread's
    assert sum(work_records(tmp_path / "t" / "exec.1").values()) == 60


def test_forks_while_daemon_f_attaches_and_instruments(tmp_path):
    """New threads fork one after another while ``daemon -f`` attaches, then
    instruments once the attach's stop is over (two more stops): every fork
    child is cleaned, whenever it was made; three sessions in turn.  The
    attach's stop maps the call page (process/call_page.py) for the
    instrument; before the fix, clones were not followed until the instrument
    mapped its areas, so a thread made in between that forked left
    madtrace-calls in its child (status 1: in most sessions, not all; the
    instrument may come within a few ms of the attach)."""
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    program = Program("O2-pie")
    total = 0
    try:
        for cycle in range(3):
            answers: list[str] = []
            done = threading.Event()

            def forks(answers=answers, done=done):
                while not done.is_set():
                    answers.append(program.ask("fork 1"))
            feeder = threading.Thread(target=forks)
            feeder.start()
            try:
                daemon = start_daemon(runtime, program.pid, tmp_path / f"t{cycle}",
                                      how=("daemon", "-f", "work"))
                ctl_until(runtime, program.pid, ["status"], lambda s: s["ring_pool"]["on"])
                time.sleep(0.2)                         # forks with the pool on too
            finally:
                done.set()
                feeder.join(timeout=120)
            bad = [a for a in answers if not re.fullmatch(r"forked \d+ status 0 calls 1", a)]
            assert answers and not bad, (cycle, len(answers), bad[:5])
            total += len(answers)
            assert ctl(runtime, program.pid, "stop")
            wait_gone(daemon)
            assert madtrace_maps(program.pid) == []
        assert program.ask("quit") == f"total {total}"
        assert program.proc.wait(timeout=60) == 0
    finally:
        program.proc.kill()


def test_daemon_killed_while_threads_take_rings_then_a_new_session(tmp_path):
    """SIGKILL the daemon: the server goes on answering right, with new threads
    reusing TCBs whose slots hold rings nobody drains any more; the next daemon
    takes everything of the dead one out (leftovers.py) and counts anew."""
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    server = subprocess.Popen([prog("thread_server", "O2-pie")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        port = int(re.match(rb"port (\d+)", read_line(server)).group(1))
        daemon = start_daemon(runtime, server.pid, tmp_path / "t")
        ctl(runtime, server.pid, "instrument", "handle", "work")
        sizes = [(i * 13) % 50 for i in range(40)]
        for n in sizes[:20]:
            assert ask(port, n) == expected_sum(n)
        os.kill(daemon, signal.SIGKILL)
        wait_gone(daemon)
        for n in sizes[20:]:                   # no tracer: threads take over, pool runs dry
            assert ask(port, n) == expected_sum(n)
        os.unlink(os.path.join(runtime, "madtrace", f"{server.pid}.sock"))
        daemon = start_daemon(runtime, server.pid, tmp_path / "t2")
        ctl(runtime, server.pid, "instrument", "handle", "work")
        for n in (5, 6, 7):
            assert ask(port, n) == expected_sum(n)
        assert ctl(runtime, server.pid, "calls", "--json") == {"handle": 3, "work": 18}
        assert ctl(runtime, server.pid, "stop")
        wait_gone(daemon)
        assert madtrace_maps(server.pid) == []
        with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
            conn.sendall(b"4\n")
            assert int(conn.makefile().readline()) == expected_sum(4)
        out, _ = server.communicate(b"", timeout=60)
    finally:
        server.kill()
    assert server.returncode == 0
    assert out == f"served {len(sizes) + 4} works {sum(sizes) + 18 + 4}\n".encode()


def test_data_tracing_closes_the_pool_and_threads_are_traced_again(tmp_path):
    """Data tracing needs every thread traced: ``trace data on`` closes the pool
    (the rings of ended threads go back, so a new thread given one of their TCBs
    gets its ring from the tracer); calls stay exact across the change."""
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    program = Program("O2-pie")
    try:
        daemon = start_daemon(runtime, program.pid, tmp_path / "t")
        ctl(runtime, program.pid, "instrument", "work")
        assert re.fullmatch(r"joined 30 calls 90 sum \d+", program.ask("join 30 3"))
        ctl(runtime, program.pid, "trace", "data", "on", "[heap]")
        status = ctl(runtime, program.pid, "status", "--json")
        assert not status["ring_pool"]["on"] and status["dropped_events"] == 0
        events = status["tracer_events"]
        assert re.fullmatch(r"joined 30 calls 120 sum \d+", program.ask("join 30 4"))
        waiting = program.ask("wait")
        assert tracer_of(int(waiting.split()[1])) == daemon      # traced from its creation
        assert program.ask("go") == "gone"
        status = ctl(runtime, program.pid, "status", "--json")
        assert status["tracer_events"] > events and status["dropped_events"] == 0
        assert ctl(runtime, program.pid, "calls", "--json") == {"work": 90 + 120 + 2}
        assert ctl(runtime, program.pid, "stop")
        wait_gone(daemon)
        assert madtrace_maps(program.pid) == []
        assert program.ask("quit") == "total 212"
        assert program.proc.wait(timeout=60) == 0
    finally:
        program.proc.kill()


def test_status_counts_the_pool_after_its_drain():
    """``status`` drains the rings first (the drain adopts the rings claimed so far and
    reads the owners of those taken over): its ring_pool counts are those after that
    drain.  Counted before it, a drain thread behind on a loaded machine made
    claimed + taken_over fall short of the threads that took a ring (1 + 127 of 301
    in test_new_threads_take_rings_without_stopping_and_every_call_counts)."""
    from types import SimpleNamespace as NS

    from madtrace.live.commands.status import Status

    pool = {"claimed": 1, "taken_over": 0}

    def drain_all():
        pool["taken_over"] = 300        # what the drain reads of the rings' owners
        return 0
    rings = NS(take_peaks=dict, drain_all=drain_all, records_per_thread={}, fill=dict,
               totals=lambda: {"dropped": 0, "unregistered_records": 0, "ring_waits": 0})
    engine = NS(patches_of={}, patches=[], rings=rings,
                threads=NS(hooks=[], summary=lambda: dict(pool, on=True)))
    session = NS(functions=engine, traced_functions=lambda: [], pid=1, scratch={},
                 recording=NS(meta={}, options=NS(output="t"), data=None),
                 tracee=NS(threads={1: None}), last_pause=0.0, last_stops=[], stop_windows=[],
                 controller=NS(attach_window=None, attach_pause=None, events_handled=0))
    status = Status().run(session, None)
    assert status["ring_pool"]["claimed"] + status["ring_pool"]["taken_over"] == 301
