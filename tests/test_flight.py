# SPDX-License-Identifier: GPL-2.0-or-later
"""The flight recorder: --flight SIZE / --keep SECONDS keep the last part of a
recording in memory and write it, on a trigger, as an ordinary trace
directory (DIR/snapshot.N).

Oracles: a whole recording of the same program (each call of work() makes
the same accesses in both; the heap block allocated before the window keeps
its forged name), the program's own output and exit signal (the same as
untraced), the bound (meta.json's peak held bytes), the slow call made slow
on purpose (the snapshot ends with it), /proc/PID/maps after a live detach.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from .test_daemon import run, start_daemon, wait_gone
from .test_live_threads import ask
from .util import madtrace, madtrace_maps, one_line_error, prog, read_line, run_untraced, summary_json

PROGRAM = "flight_requests"


def query(directory, sql: str) -> list:
    """The rows of ``sql`` on a trace (the Python API: its store built if needed)."""
    import madtrace as api

    return api.open(str(directory)).sql(sql).fetchall()


def work_accesses(directory, whole_names: bool) -> set[str]:
    """The distinct (accesses made, data named) of completed work() calls; with
    ``whole_names`` the names without their element or offset.  A heap block's
    number is left out: it counts the blocks the tracer saw before (a mapping the
    program made early may come before it in one run and not in another)."""
    data = "regexp_replace(a.data, '^<(calloc|malloc)\\d+@', '<\\1@')"
    if whole_names:
        data = f"regexp_replace({data}, '(\\[\\d+\\]|\\+\\d+)$', '')"
    return set(
        r[0]
        for r in query(
            directory,
            f"SELECT DISTINCT c.accesses_self || ' ' || (SELECT string_agg(DISTINCT {data}, "
            f"',' ORDER BY {data}) FROM accesses a WHERE a.call_id = c.call_id AND "
            f"a.tid = c.tid) FROM calls c WHERE c.function = 'work' AND c.fate = 'completed'",
        )
    )


def flight_meta(directory) -> dict:
    with open(os.path.join(directory, "meta.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-pie"])
def test_the_window_is_a_trace_like_the_whole_recording(tmp_path, variant):
    argv = [prog(PROGRAM, variant), "3000", "-1"]
    whole, folder = tmp_path / "whole", tmp_path / "flight"
    r = madtrace("record", "--data", "-q", "-o", str(whole), "--", *argv, timeout=300)
    assert r.returncode == 0, r.stderr
    r = madtrace("record", "--data", "--flight", "2M", "-o", str(folder), "--", *argv, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run_untraced(argv).stdout
    snapshot = folder / "snapshot.1"
    meta = flight_meta(snapshot)
    flight = meta["flight"]
    assert flight["trigger"] == "end" and flight["dropped_call_records"] > 0
    assert flight["peak_bytes"] <= 2 << 20
    with open(folder / "flight.json") as f:
        assert [s["directory"] for s in json.load(f)["snapshots"]] == ["snapshot.1"]
    # each work() call of the window makes the accesses it makes in the whole trace,
    # to the same data: the heap block allocated before the window keeps its name
    expected = work_accesses(whole, True)
    assert len(expected) == 1 and "<calloc@main+" in next(iter(expected)), expected
    assert work_accesses(snapshot, True) == expected
    assert work_accesses(snapshot, False) <= work_accesses(whole, False)
    # fewer calls than the whole run, every access of the window inside a call
    window_calls = query(
        snapshot, "SELECT count(*) FROM calls WHERE function = 'work' AND fate <> 'unmatched'"
    )[0][0]  # (its exit alone in the window)
    assert 1000 < window_calls < 3000 * 100
    summary = summary_json(snapshot)
    assert summary["calls"]["work"] == window_calls
    outside = query(
        snapshot, "SELECT count(*) FROM accesses WHERE call_id IS NULL AND data IN ('table', 'heap')"
    )[0][0]
    assert outside < 5000  # only a block across the window's start: outside any call


def test_a_slow_call_writes_the_window_that_ends_with_it(tmp_path):
    argv = [prog(PROGRAM, "O0-nopie"), "3000", "1500"]
    folder = tmp_path / "flight"
    r = madtrace(
        "record",
        "--data",
        "--flight",
        "8M",
        "--trigger-slow",
        "handle:20ms",
        "-o",
        str(folder),
        "--",
        *argv,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == run_untraced(argv).stdout
    snapshot = folder / "snapshot.1"
    flight = flight_meta(snapshot)["flight"]
    # request 1500 sleeps 30 ms (a loaded machine may make another call slow first)
    took = re.fullmatch(r"slow handle:20ms \((\d+\.\d+) ms, thread \d+\)", flight["trigger"])
    assert took and flight["cut_at_trigger"], flight
    assert not (folder / "snapshot.2").exists()  # no end snapshot after a trigger's
    # the window ends with that call: the last call completed, of that duration
    last = query(
        snapshot,
        "SELECT function, duration_ns, accesses_incl FROM calls "
        "WHERE fate = 'completed' ORDER BY end_tsc DESC LIMIT 1",
    )[0]
    assert last[0] == "handle" and abs(last[1] / 1e6 / float(took.group(1)) - 1) < 0.01, (
        last
    )  # (two TSC rates)
    # its work() calls' accesses, named: the global table and the heap block
    assert last[2] >= 100
    named = [
        r[0]
        for r in query(
            snapshot,
            "SELECT DISTINCT data FROM accesses a JOIN calls c "
            "USING (tid, call_id) WHERE c.function = 'work'",
        )
    ]
    assert any(d.startswith("table[") for d in named)
    assert any(re.match(r"<calloc\d+@main\+", d) for d in named)


def test_the_nth_call_writes_the_window_that_ends_at_its_entry(tmp_path):
    argv = [prog(PROGRAM, "O2-pie"), "3000", "-1"]
    folder = tmp_path / "flight"
    r = madtrace(
        "record",
        "--flight",
        "64M",
        "--trigger-on",
        "handle:1000",
        "-o",
        str(folder),
        "--",
        *argv,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    flight = flight_meta(folder / "snapshot.1")["flight"]
    assert re.fullmatch(r"on handle:1000 \(thread \d+\)", flight["trigger"]), flight
    assert flight["cut_at_trigger"] and flight["dropped_call_records"] == 0
    # nothing dropped (64M): the window holds the 1000 calls of handle, the last one
    # entered only: the snapshot ends at its entry record
    assert summary_json(folder / "snapshot.1")["calls"]["handle"] == 1000
    fates = dict(
        query(
            folder / "snapshot.1", "SELECT fate, count(*) FROM calls WHERE function = 'handle' GROUP BY fate"
        )
    )
    assert fates.get("completed") == 999 and sum(fates.values()) == 1000, fates


def test_after_an_exec_the_window_is_the_new_images(tmp_path):
    argv = ["sh", "-c", f"exec {prog(PROGRAM, 'O2-pie')} 3000 -1"]
    folder = tmp_path / "flight"
    r = madtrace("record", "--data", "--flight", "2M", "-o", str(folder), "--", *argv, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run_untraced(argv).stdout
    assert sorted(os.listdir(folder)) == ["flight.json", "snapshot.1"]  # no exec.N on disk
    one_line_error(madtrace("summary", str(folder)), 18, "(the last: " + str(folder / "snapshot.1"))
    meta = flight_meta(folder / "snapshot.1")
    assert meta["mode"] == "exec" and meta["command"][0].endswith(f"{PROGRAM}-O2-pie")
    assert summary_json(folder / "snapshot.1")["calls"]["work"] > 0


@pytest.mark.parametrize("how,signum", [("segv", signal.SIGSEGV), ("abort", signal.SIGABRT)])
def test_a_crash_writes_what_led_to_it_then_the_program_dies_of_it(tmp_path, how, signum):
    argv = [prog(PROGRAM, "O2-pie"), "2000", "-1", how]
    folder = tmp_path / "flight"
    r = madtrace("record", "--flight", "4M", "-o", str(folder), "--", *argv, timeout=300)
    untraced = run_untraced(argv)
    assert untraced.returncode == -signum
    assert r.returncode == 128 + signum and r.stdout == untraced.stdout
    flight = flight_meta(folder / "snapshot.1")["flight"]
    assert (
        flight["trigger"]
        == f"crash: {signal.Signals(signum).name} in thread " + flight["trigger"].rsplit(" ", 1)[1]
    )
    assert summary_json(folder / "snapshot.1")["calls"]["handle"] > 0


def test_signal_to_the_tracer_keep_and_the_last_snapshots(tmp_path):
    folder = tmp_path / "flight"
    tracer = subprocess.Popen(
        [
            *madtrace_argv(),
            "record",
            "--keep",
            "0.3",
            "--snapshots",
            "2",
            "-o",
            str(folder),
            "--",
            prog(PROGRAM, "O2-pie"),
            "100000000",
            "-1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for n in range(1, 4):
            deadline = time.monotonic() + 60
            while not (folder / "flight.json").exists():
                assert time.monotonic() < deadline and tracer.poll() is None, tracer.stderr
                time.sleep(0.05)
            time.sleep(0.8)
            tracer.send_signal(signal.SIGUSR1)
            while not (folder / f"snapshot.{n}" / "meta.json").exists():
                assert time.monotonic() < deadline, tracer.stderr
                time.sleep(0.05)
            time.sleep(1.2)  # snapshots of triggers are at least a second apart
    finally:
        # the program ends (killed): the recording ends with it
        subprocess.run(["pkill", "-TERM", "-P", str(tracer.pid)])
        _, err = tracer.communicate(timeout=120)
    assert sorted(os.listdir(folder)) == ["flight.json", "snapshot.2", "snapshot.3"], err
    for n in (2, 3):
        flight = flight_meta(folder / f"snapshot.{n}")["flight"]
        assert flight["trigger"] == "SIGUSR1 to madtrace"
        assert 0.25 <= flight["seconds"] < 0.3 + 0.5, flight  # ticks of 50 ms
        assert summary_json(folder / f"snapshot.{n}")["calls"]["work"] > 0


def madtrace_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "madtrace.cli.main"]


def test_flight_recorder_attached_to_a_live_server(tmp_path):
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    server = subprocess.Popen(
        [prog("thread_server", "O2-pie")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    folder = tmp_path / "flight"
    try:
        port = int(re.match(rb"port (\d+)", read_line(server)).group(1))
        daemon = start_daemon(
            runtime,
            server.pid,
            folder,
            how=("daemon", "--flight", "8M", "--data", "-f", "handle", "-f", "work"),
        )
        written = []
        for round_ in range(2):
            for i in range(40):
                ask(port, 50 + i)
            result = run(runtime, "ctl", str(server.pid), "snapshot", "--json")
            assert result.returncode == 0, result.stderr
            written.append(json.loads(result.stdout)["directory"])
        assert run(runtime, "ctl", str(server.pid), "stop").returncode == 0
        wait_gone(daemon)
        assert madtrace_maps(server.pid) == []
        out, _ = server.communicate(b"", timeout=60)
    finally:
        server.kill()
    assert server.returncode == 0 and out.startswith(b"served 80 ")
    assert [os.path.basename(w) for w in written] == ["snapshot.1", "snapshot.2"]
    for directory in written:
        calls = summary_json(directory)["calls"]
        handles = query(
            directory, "SELECT count(*) FROM calls WHERE function = 'handle' AND fate = 'completed'"
        )
        # each completed request: handle() once and work() 50..89 times, all in the window
        works = query(
            directory,
            "SELECT count(*) FROM calls w JOIN calls h ON w.parent_id = "
            "h.call_id AND w.tid = h.tid WHERE h.fate = 'completed' "
            "AND h.function = 'handle'",
        )
        assert calls["handle"] >= handles[0][0] > 0 and works[0][0] >= 50 * handles[0][0]
    assert summary_json(written[1])["calls"]["handle"] >= 40


def test_a_stream_window_gives_the_memory_of_its_oldest_chunks_back():
    """StreamWindow on a capture file in /dev/shm (tmpfs): the chunks dropped free
    their pages (st_blocks), the file keeps its size and the writer appends on."""
    import numpy as np

    from madtrace.flight.window import StreamWindow
    from madtrace.trace.format import RECORD_DTYPE
    from madtrace.trace.record_files import CALL_RECORDS

    path = f"/dev/shm/madtrace-test-window.{os.getpid()}"
    fd = CALL_RECORDS.create(path, truncate=True)
    try:
        rows = np.zeros(65536, dtype=RECORD_DTYPE)  # 1 MiB a chunk
        for tick in (1, 2, 3):
            rows["tsc"] = tick
            for _ in range(4):
                CALL_RECORDS.append(fd, rows)
            if tick == 1:
                window = StreamWindow(path, RECORD_DTYPE.itemsize)
            window.scan(tick)
        before = os.stat(path)
        freed = window.drop_through(2)
        after = os.stat(path)
        assert freed == 8 * (16 + (1 << 20)) and window.dropped_records == 8 * 65536
        assert after.st_size == before.st_size
        assert before.st_blocks * 512 - after.st_blocks * 512 >= 8 * (1 << 20) - 4096
        kept = window.chunks()
        assert len(kept) == 4
        for offset, length in kept:
            assert set(np.frombuffer(window.payload(offset, length), RECORD_DTYPE)["tsc"]) == {3}
        CALL_RECORDS.append(fd, rows)  # the writer goes on after the punch
        assert window.scan(4) == 16 + (1 << 20) and len(window.chunks()) == 5
    finally:
        os.close(fd)
        window.close()
        os.unlink(path)


def test_flight_recorder_errors(tmp_path):
    argv = ["--", prog(PROGRAM, "O2-pie"), "10", "-1"]
    out = str(tmp_path / "t")
    one_line_error(madtrace("record", "--trigger-on", "work", "-o", out, *argv), 2, "go with --flight")
    one_line_error(madtrace("record", "--flight", "lots", "-o", out, *argv), 2, "--flight")
    one_line_error(
        madtrace("record", "--flight", "4M", "--max-size", "8M", "-o", out, *argv), 2, "contradict"
    )
    one_line_error(
        madtrace("record", "--flight", "4M", "--trigger-slow", "work:fast", "-o", out, *argv),
        2,
        "FUNCTION:DURATION",
    )
    one_line_error(
        madtrace("record", "--flight", "4M", "--trigger-slow", "work:5ms", "--no-time", "-o", out, *argv),
        2,
        "--no-time",
    )
    os.mkdir(out)
    before = set(os.listdir("/dev/shm"))
    one_line_error(madtrace("record", "--flight", "4M", "-o", out, *argv), 17, "already exists")
    assert set(os.listdir("/dev/shm")) == before  # no flight recorder's memory left
