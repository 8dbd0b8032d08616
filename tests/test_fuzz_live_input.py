# SPDX-License-Identifier: GPL-2.0-or-later
"""What users and programs type at a live session, fuzzed (hypothesis).

* The control socket of a daemon gets arbitrary lines: bytes that are not
  JSON, JSON that is not an object, objects with odd fields, command lines
  of random words.  Each gets a reply or the connection ends; the daemon
  keeps serving (``ctl status`` answers afterwards), the target runs on and
  its output is intact after ``ctl stop``.
* The REPL's parser gets arbitrary lines: a command or one one-line error,
  never an exception of another kind.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from madtrace.errors import MadtraceError
from madtrace.live.parser import parse

from .test_daemon import ctl_json, run, start_daemon, wait_gone
from .util import check_live_output, finish_live, prog, start_ready

WORDS = st.sampled_from(["instrument", "restore", "calls", "status", "funcs", "trace", "data",
                         "on", "off", "in", "watch", "x", "regs", "maps", "top", "save", "help",
                         "tick", "tock", "*", "all", "--json", "--force", "libc.so.6:mem*", "'",
                         '"', "0x0", "-1", "99999999999999999999", "\x00", "..", "/", "sleep"])
LINES = st.one_of(st.text(max_size=80), st.lists(WORDS, max_size=6).map(" ".join))
MESSAGES = st.one_of(
    st.binary(max_size=64).filter(lambda b: b"\n" not in b).map(lambda b: b + b"\n"),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8),
                                                                             inner, max_size=3),
                 max_leaves=8).map(lambda v: json.dumps(v).encode() + b"\n"),
    LINES.map(lambda line: json.dumps({"line": line}).encode() + b"\n"),
    st.fixed_dictionaries({"complete": st.one_of(st.text(max_size=10), st.integers(), st.none()),
                           "word": st.one_of(st.text(max_size=10), st.integers())})
    .map(lambda d: json.dumps(d).encode() + b"\n"),
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz-live")
    runtime = str(tmp / "run")
    os.mkdir(runtime)
    argv = [prog("live_calls", "O2-pie")]
    target = start_ready(argv)
    try:
        pid = start_daemon(runtime, target.pid, tmp / "t")
        yield runtime, target, argv, pid
    finally:
        target.kill()


def exchange(runtime: str, pid: int, payload: bytes) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(120)
    try:
        sock.connect(os.path.join(runtime, "madtrace", f"{pid}.sock"))
        reader = sock.makefile("rb")
        hello = json.loads(reader.readline())
        assert hello["hello"] == "madtrace"
        sock.sendall(payload)
        reply = reader.readline()
        if reply:                        # a reply, or the daemon ended this connection
            answer = json.loads(reply)
            assert not str(answer.get("error", "")).startswith("internal error"), (payload, answer)
    finally:
        sock.close()


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payload=MESSAGES)
def test_control_socket_takes_anything(daemon, payload):
    runtime, target, _, _ = daemon
    exchange(runtime, target.pid, payload)
    assert target.poll() is None


def test_daemon_still_serves_after_the_fuzz(daemon):
    runtime, target, argv, pid = daemon
    status = ctl_json(runtime, target.pid, "status")
    assert status["pid"] == target.pid
    result = run(runtime, "ctl", str(target.pid), "stop")
    assert result.returncode == 0, result.stderr
    wait_gone(pid)
    check_live_output(argv[0], finish_live(target))
    assert target.returncode == 0
    with open(os.path.join(runtime, "madtrace", f"{target.pid}.log")) as f:
        log = f.read()
    assert "Traceback" not in log and "Exception in thread" not in log, log[-2000:]


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")), deadline=None)
@given(line=LINES)
def test_repl_parser_takes_anything(line):
    try:
        parse(line)
    except MadtraceError as exc:
        assert "\n" not in str(exc)
