# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace installed the way Python tools are: a wheel built from the checkout
(setup.py builds every native part into it) and installed into a fresh venv
outside the tree, then run from there against the in-tree run of the same
programs; and ``madtrace doctor``, on this machine and under a seccomp filter
that refuses ptrace (what a container's default profile does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .util import MADTRACE, ROOT, prog

# a BPF filter: ptrace (101) answers EPERM, everything else runs
SECCOMP_DENY_PTRACE = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def stmt(code, k): return struct.pack("HBBI", code, 0, 0, k)
def jump(code, k, jt, jf): return struct.pack("HBBI", code, jt, jf, k)
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
prog = b"".join([stmt(BPF_LD_W_ABS, 0), jump(BPF_JEQ_K, 101, 0, 1),
                 stmt(BPF_RET_K, 0x00050000 | 1), stmt(BPF_RET_K, 0x7fff0000)])
buf = ctypes.create_string_buffer(prog)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
assert libc.prctl(38, 1, 0, 0, 0) == 0                       # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0     # PR_SET_SECCOMP, FILTER
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def doctor(*extra, wrap: bool = False) -> subprocess.CompletedProcess:
    command = [*MADTRACE, "doctor", *extra]
    if wrap:
        command = [sys.executable, "-c", SECCOMP_DENY_PTRACE, *command[1:]]
    return subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))


def test_doctor_says_tracing_works_here():
    result = doctor("--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    states = {c["name"]: c["state"] for c in report["checks"]}
    assert report["ok"] and states["ptrace"] in ("ok", "warn") and states["native parts"] == "ok"
    text = doctor()
    assert text.returncode == 0 and text.stdout.startswith("madtrace doctor: tracing works")


def test_doctor_names_a_refused_ptrace_and_its_fix():
    result = doctor(wrap=True)
    assert result.returncode == 26, result.stdout + result.stderr
    ptrace = [line for line in result.stdout.splitlines() if "ptrace:" in line]
    assert ptrace and "fail" in ptrace[0] and "EPERM" in ptrace[0], result.stdout
    assert "fix:" in result.stdout and "SYS_PTRACE" in result.stdout
    assert result.stderr.strip().startswith("madtrace: this machine lacks what tracing needs")
    # the same in JSON: one object, the failure named
    report = json.loads(doctor("--json", wrap=True).stdout)
    assert not report["ok"] and any(c["name"] == "ptrace" and c["state"] == "fail"
                                    for c in report["checks"])


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel of the checkout installed into a fresh venv outside the tree."""
    base = tmp_path_factory.mktemp("install")
    wheels, venv = base / "wheels", base / "venv"
    venv_python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
                    ROOT], check=True, timeout=900, capture_output=True)
    wheel = next(wheels.glob("madtrace-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run([str(venv_python), "-m", "pip", "install", "-q", str(wheel)],
                          timeout=900, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return venv


def run_installed(venv, *args, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(venv / "bin" / "madtrace"), *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)


def test_the_installed_madtrace_traces_as_the_checkout_does(installed, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    version = run_installed(installed, "--version", cwd=cwd)
    assert version.returncode == 0 and version.stdout.startswith("madtrace ")
    where = subprocess.run([str(installed / "bin" / "python"), "-c",
                            "import madtrace.native as n; print(n.NATIVE_DIR)"],
                           capture_output=True, text=True, cwd=cwd,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert where.stdout.strip().startswith(str(installed)), where.stdout  # its own parts
    assert run_installed(installed, "doctor", cwd=cwd).returncode == 0
    for name, options in (("calls_recursion", ["-f", "fib"]), ("data_globals", ["--data"])):
        program = prog(name, "O2-pie")
        ours, theirs = tmp_path / f"{name}.installed", tmp_path / f"{name}.checkout"
        got = run_installed(installed, "record", "-q", *options, "-o", str(ours), "--", program,
                            cwd=cwd)
        assert got.returncode == 0, got.stderr
        ref = subprocess.run([*MADTRACE, "record", "-q", *options, "-o", str(theirs), "--",
                              program], capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, PYTHONPATH=ROOT))
        assert ref.returncode == 0, ref.stderr
        assert got.stdout == ref.stdout                        # the program's own output
        for query in ("SELECT function, count(*) AS n FROM calls GROUP BY ALL ORDER BY ALL",
                      "SELECT kind, count(*) AS n FROM accesses GROUP BY ALL ORDER BY ALL"):
            if "accesses" in query and "--data" not in options:
                continue
            a = run_installed(installed, "query", str(ours), query, "--json", cwd=cwd)
            b = subprocess.run([*MADTRACE, "query", str(theirs), query, "--json"],
                               capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
            assert a.returncode == 0 and json.loads(a.stdout) == json.loads(b.stdout), a.stderr
        report = run_installed(installed, "report", str(ours), "--json", cwd=cwd)
        assert report.returncode == 0 and json.loads(report.stdout)


def test_the_installed_client_runs_the_installed_python(installed, tmp_path):
    ctl = installed / "bin" / "madtrace-ctl"
    assert os.access(ctl, os.X_OK)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(ctl), "doctor", "--json"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    native = [c for c in json.loads(out.stdout)["checks"] if c["name"] == "native parts"]
    assert "in the package" in native[0]["says"] and str(installed) in native[0]["says"]
