# SPDX-License-Identifier: GPL-2.0-or-later
"""Live sessions on programs that create threads all the time.

* tests/progs/thread_server: a thread per request (127.0.0.1); while a daemon
  has handle() and work() instrumented, every request's calls are counted:
  handle() once per request, work() N times for a request of N (the server
  counts them itself); each request thread's records hold handle's entry, its
  N work calls and handle's exit, in order.
* tests/progs/churn (threads created and joined continuously, forks, vforks,
  execs): attached, instrumented, restored and detached 20 times; its own
  checks of every result and its totals hold, nothing of madtrace stays
  mapped.
Oracles: the programs' own counts and output, /proc/PID/maps."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import threading

import pytest

from madtrace.trace.capture_file import CHUNK_HEADER_SIZE, HEADER_SIZE
from madtrace.trace.record_files import CALL_RECORDS
from madtrace.trace.reader import iter_call_chunks

from .test_daemon import run, start_daemon, wait_gone
from .test_live_load import check_churn_output
from .util import madtrace_maps, prog, read_line, start_ready

REQUESTS = 60


def ask(port: int, n: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(f"{n}\n".encode())
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = conn.recv(64)
            assert chunk, "the server closed the connection without an answer"
            answer += chunk
    return int(answer)


def expected_sum(n: int) -> int:
    return sum((i * 2654435761 + 7) & 0xFFFFFFFFFFFFFFFF for i in range(n)) & 0xFFFFFFFFFFFFFFFF


def stop_and_finish(runtime: str, server: subprocess.Popen, daemon: int) -> tuple[dict, bytes]:
    """status --json, then stop: the daemon ends, nothing of madtrace stays mapped
    in the server, which then ends (end of its stdin).  (status, its output)."""
    status = json.loads(run(runtime, "ctl", str(server.pid), "status", "--json").stdout)
    assert run(runtime, "ctl", str(server.pid), "stop").returncode == 0
    wait_gone(daemon)
    assert madtrace_maps(server.pid) == []
    out, _ = server.communicate(b"", timeout=60)
    return status, out


@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_thread_per_request_server_stays_exact(tmp_path, variant):
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    server = subprocess.Popen([prog("thread_server", variant)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        port = int(re.match(rb"port (\d+)", read_line(server)).group(1))
        daemon = start_daemon(runtime, server.pid, tmp_path / "t")
        result = run(runtime, "ctl", str(server.pid), "instrument", "handle", "work")
        assert result.returncode == 0, result.stderr
        before = json.loads(run(runtime, "ctl", str(server.pid), "status", "--json").stdout)
        sizes = [(i * 37) % 200 for i in range(REQUESTS)]
        answers: dict[int, int] = {}

        def client(k: int) -> None:             # three clients at once: threads overlap
            for i in range(k, REQUESTS, 3):
                answers[i] = ask(port, sizes[i])
        clients = [threading.Thread(target=client, args=(k,)) for k in range(3)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        calls = json.loads(run(runtime, "ctl", str(server.pid), "calls", "--json").stdout)
        status, out = stop_and_finish(runtime, server, daemon)
    finally:
        server.kill()
    assert server.returncode == 0
    assert out == f"served {REQUESTS} works {sum(sizes)}\n".encode()
    assert answers == {i: expected_sum(sizes[i]) for i in range(REQUESTS)}
    assert calls == {"handle": REQUESTS, "work": sum(sizes)}
    assert status["dropped_events"] == 0
    # the request threads were never traced: no ptrace stop, each took a ring itself
    # (from the pool, or the one of the thread whose TCB glibc gave it), even when
    # the pool ran low and more rings were mapped (a stop of the traced threads only)
    assert status["tracer_events"] == before["tracer_events"]
    pool = status["ring_pool"]
    assert pool["on"] and pool["claimed"] + pool["taken_over"] == REQUESTS, pool
    with open(tmp_path / "t" / "functions.json") as f:
        sites = json.load(f)["sites"]
    function_of = {s["sid"]: s["function"] for s in sites}
    per_request = []
    texts: dict[int, str] = {}
    for tid, chunk in iter_call_chunks(str(tmp_path / "t")):
        names = [function_of[int(code) >> 1] + ("<" if code & 1 else ">") for code in chunk["code"]]
        texts[tid] = texts.get(tid, "") + " ".join(names) + " "
    for tid, text in texts.items():
        # one request per thread, in its own file (though a thread took over the ring
        # of the one before it on the same TCB)
        assert re.fullmatch(r"handle> (work> work< )*handle< ", text), (tid, text[:200])
        per_request.append(text.count("work>"))
    assert sorted(per_request) == sorted(sizes)


def tracer_of(tid: int) -> int:
    with open(f"/proc/{tid}/status") as f:
        return int(re.search(r"TracerPid:\s+(\d+)", f.read()).group(1))


def wait_threads(pid: int, n: int) -> list[int]:
    """The threads of ``pid`` once there are exactly ``n`` (a loaded machine gets
    its time: request threads end a moment after their answer)."""
    for _ in range(6000):
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        if len(tids) == n:
            return tids
        threading.Event().wait(0.01)
    raise AssertionError(f"process {pid} has {len(tids)} threads, not {n}")


def test_threads_made_while_nothing_is_instrumented_are_not_traced_then_counted(tmp_path):
    """Attached with nothing instrumented, new threads run untraced (no ptrace stop
    when they are created: TracerPid 0); instrument seizes them first: calls of
    threads made before it are counted, as are those of threads made after
    (untraced too: they take their rings from the pool); after restore
    (madtrace's areas stay mapped until detach) new threads stay untraced; a
    second instrument counts on.  Oracles: the server's own counts and answers,
    TracerPid, /proc/PID/maps."""
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    server = subprocess.Popen([prog("thread_server", "O2-pie")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    counted = uncounted = 0
    try:
        port = int(re.match(rb"port (\d+)", read_line(server)).group(1))
        daemon = start_daemon(runtime, server.pid, tmp_path / "t")
        for cycle in range(2):
            wait_threads(server.pid, 1)
            waiting = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(3)]
            tids = wait_threads(server.pid, 4)      # a thread per connection, blocked reading
            assert tracer_of(server.pid) == daemon
            assert [tracer_of(t) for t in tids if t != server.pid] == [0] * 3
            assert ask(port, 5) == expected_sum(5)  # made and gone untraced: not counted
            uncounted += 1
            result = run(runtime, "ctl", str(server.pid), "instrument", "handle", "work")
            assert result.returncode == 0, result.stderr
            assert all(tracer_of(t) == daemon for t in tids if os.path.exists(f"/proc/{t}"))
            for i, conn in enumerate(waiting):      # threads made before instrument
                conn.sendall(f"{10 + i}\n".encode())
                assert int(conn.makefile().readline()) == expected_sum(10 + i)
                conn.close()
            for n in (7, 0, 3):                     # threads made after it
                assert ask(port, n) == expected_sum(n)
            counted += 6
            calls = json.loads(run(runtime, "ctl", str(server.pid), "calls", "--json").stdout)
            assert calls == {"handle": counted, "work": (33 + 10) * (cycle + 1)}, cycle
            result = run(runtime, "ctl", str(server.pid), "restore", "all")
            assert result.returncode == 0, result.stderr
        status, out = stop_and_finish(runtime, server, daemon)
    finally:
        server.kill()
    assert server.returncode == 0
    assert out == f"served {counted + uncounted} works {43 * 2 + 5 * 2}\n".encode()
    assert status["dropped_events"] == 0


def test_churn_attached_instrumented_restored_detached_twenty_times(tmp_path):
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    target = start_ready([prog("churn", "O2-pie"), "0", "ready"])
    try:
        for cycle in range(20):
            daemon = start_daemon(runtime, target.pid, tmp_path / f"t{cycle}")
            for words in (["instrument", "square"], ["restore", "all"], ["stop"]):
                result = run(runtime, "ctl", str(target.pid), *words)
                assert result.returncode == 0, (cycle, words, result.stderr.decode())
            wait_gone(daemon)
            assert target.poll() is None, cycle
            assert madtrace_maps(target.pid) == [], cycle
        out, _ = target.communicate(b"\n", timeout=120)
    finally:
        target.kill()
    check_churn_output(target, out)


def stop_and_quit(runtime: str, target: subprocess.Popen, daemon: int) -> None:
    """The daemon stopped, then bench_live told to quit: it ends well."""
    assert run(runtime, "ctl", str(target.pid), "stop").returncode == 0
    wait_gone(daemon)
    target.stdin.write(b"quit\n")
    target.stdin.flush()
    assert target.wait(timeout=60) == 0


@pytest.mark.parametrize("extra", [[], ["--no-time"]])
def test_attached_burst_is_exact_and_status_tells_fill_and_drops(tmp_path, extra):
    """Attached, a burst of 3 M calls of leaf() (6 M records, 23 rings' worth):
    every call is counted, nothing is dropped, and status says how full the ring
    was at its fullest (above zero: it was not idle) and how many records waited
    for room.  Oracle: the program's own checksum (untraced and traced alike)
    and its call count; the records in calls/."""
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    n = 3_000_000
    target = start_ready([prog("bench_live", "O2-pie")])
    try:
        target.stdin.write(f"calls {n}\n".encode())
        target.stdin.flush()
        untraced = re.search(rb"checksum (\d+)", read_line(target)).group(1)
        daemon = start_daemon(runtime, target.pid, tmp_path / "t", how=("daemon", *extra))
        assert run(runtime, "ctl", str(target.pid), "instrument", "leaf").returncode == 0
        target.stdin.write(f"calls {n}\n".encode())
        target.stdin.flush()
        traced = re.search(rb"checksum (\d+)", read_line(target, timeout=120)).group(1)
        status = json.loads(run(runtime, "ctl", str(target.pid), "status", "--json").stdout)
        calls = json.loads(run(runtime, "ctl", str(target.pid), "calls", "--json").stdout)
        after = json.loads(run(runtime, "ctl", str(target.pid), "status", "--json").stdout)
        assert run(runtime, "ctl", str(target.pid), "stop").returncode == 0
        wait_gone(daemon)
        assert madtrace_maps(target.pid) == []
        target.stdin.write(b"quit\n")
        target.stdin.flush()
        assert target.wait(timeout=60) == 0
    finally:
        target.kill()
    # a count short of n says which it is: drops (a drain that fell behind), or none
    # (calls lost silently); the daemon's log says why recording stopped, if it did
    told = {"status": {k: status.get(k) for k in ("records", "dropped_events", "ring_fill",
                                                  "ring_peak", "ring_waits", "ring_pool")},
            "status after calls": {k: after.get(k) for k in ("records", "dropped_events")},
            "log": _read(os.path.join(runtime, "madtrace", f"{target.pid}.log"))}
    assert traced == untraced
    assert calls == {"leaf": n}, told
    assert status["dropped_events"] == 0, told
    assert status["records"] == 2 * n
    assert max(status["ring_peak"].values()) > 0
    assert status["ring_waits"] >= 0 and "ring_fill" in status
    records = sum(len(chunk) for _, chunk in iter_call_chunks(str(tmp_path / "t")))
    assert records == 2 * n


def test_attached_burst_waits_for_a_stopped_tracer(tmp_path):
    """The tracer stopped (SIGSTOP: as a drain starved of the CPU on a loaded
    machine) for longer than a writer's first round of waiting: the writer
    asks the kernel whether the tracer still lives and waits on; once the
    tracer runs again, every call is counted and nothing is dropped."""
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    n = 2_000_000
    target = start_ready([prog("bench_live", "O2-pie")])
    try:
        daemon = start_daemon(runtime, target.pid, tmp_path / "t", how=("daemon", "--no-time"))
        assert run(runtime, "ctl", str(target.pid), "instrument", "leaf").returncode == 0
        os.kill(daemon, signal.SIGSTOP)
        try:
            target.stdin.write(f"calls {n}\n".encode())
            target.stdin.flush()
            ready, _, _ = select.select([target.stdout], [], [], 1.5)   # > a round (~0.25 s)
            assert not ready, "the burst ended while the tracer was stopped: records went nowhere"
        finally:
            os.kill(daemon, signal.SIGCONT)
        assert re.match(rb"calls \d+ checksum", read_line(target, timeout=120))
        status = json.loads(run(runtime, "ctl", str(target.pid), "status", "--json").stdout)
        calls = json.loads(run(runtime, "ctl", str(target.pid), "calls", "--json").stdout)
        stop_and_quit(runtime, target, daemon)
    finally:
        target.kill()
    assert status["dropped_events"] == 0 and status["ring_waits"] > 0, status
    assert calls == {"leaf": n}


def test_attached_burst_is_exact_while_the_disk_stalls(tmp_path):
    """The record file cannot be written until the burst is over (a FIFO that
    nobody reads yet in its place; as a file system whose journal stalls under
    load, which took 0.66 s to create a file beside the test suite): the
    drain still takes the records out of the ring (they wait in the tracer,
    rings/drain_thread.c), so the burst ends without a drop, every call
    counted, and every record reaches the file once it can be written.
    Before, the drain waited in open(): the writer found its ring full,
    waited its bounded time and dropped the rest (131072 calls counted)."""
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    n = 1_000_000
    target = start_ready([prog("bench_live", "O2-pie")])
    copied = tmp_path / "copied.rec"
    try:
        # --no-store: no reader of the record files but the test's while the target runs
        daemon = start_daemon(runtime, target.pid, tmp_path / "t",
                              how=("daemon", "--no-time", "--no-store"))
        assert run(runtime, "ctl", str(target.pid), "instrument", "leaf").returncode == 0
        fifo = CALL_RECORDS.path(str(tmp_path / "t"), target.pid)
        os.mkfifo(fifo)
        target.stdin.write(f"calls {n}\n".encode())
        target.stdin.flush()
        assert re.match(rb"calls \d+ checksum", read_line(target, timeout=120))
        # the disk is back: what the daemon writes, until every record the drain took
        # came, into a file that then takes the FIFO's place (the session's end reads it)
        want = [1 << 62]
        reader = threading.Thread(target=copy_records, args=(fifo, copied, want))
        reader.start()
        status = json.loads(run(runtime, "ctl", str(target.pid), "status", "--json").stdout)
        calls = json.loads(run(runtime, "ctl", str(target.pid), "calls", "--json").stdout)
        want[0] = status["records"]
        reader.join(60)
        assert not reader.is_alive()
        os.replace(copied, fifo)
        stop_and_quit(runtime, target, daemon)
    finally:
        target.kill()
    assert (calls, status["dropped_events"], status["records"]) == ({"leaf": n}, 0, 2 * n)
    assert sum(len(chunk) for _, chunk in iter_call_chunks(str(tmp_path / "t"))) == 2 * n


def copy_records(fifo: str, copy: str, want: list[int]) -> None:
    """What comes out of ``fifo`` (a record file: its header, then chunks) until
    ``want[0]`` records have come (it may be set meanwhile), into ``copy``."""
    fd = os.open(fifo, os.O_RDONLY)
    data = bytearray()
    try:
        while _records_in(data) < want[0]:
            if select.select([fd], [], [], 0.05)[0]:
                chunk = os.read(fd, 1 << 20)
                assert chunk, "the record file ended early"
                data += chunk
    finally:
        os.close(fd)
    with open(copy, "wb") as f:
        f.write(data)


def _records_in(data: bytearray) -> int:
    at, records = HEADER_SIZE, 0
    while at + CHUNK_HEADER_SIZE <= len(data):
        length = struct.unpack_from("<I", data, at + 4)[0]
        if at + CHUNK_HEADER_SIZE + length > len(data):
            break
        records += length // 16
        at += CHUNK_HEADER_SIZE + length
    return records


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-4000:]
    except OSError as exc:
        return str(exc)
