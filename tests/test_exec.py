# SPDX-License-Identifier: GPL-2.0-or-later
"""A program reached through exec is traced as if it had been launched directly.

Wrapper scripts that exec the real program are everywhere (pyenv shims,
`env`, launch scripts).  After exec the new image gets a whole trace
directory of its own, DIR/exec.N, with its functions and its libraries' data
regions, from its entry point on; DIR/meta.json lists the images.  -f
patterns that match nothing yet wait for the image that defines them.
Oracle: a direct launch of the same program: same calls, same accesses per
instruction, same output."""

from __future__ import annotations

import json
import os
import shlex
import stat

import pytest

from .util import madtrace, one_line_error, prog, summary_json


def record(tmp_path, name: str, *args: str) -> tuple[str, bytes]:
    out = str(tmp_path / name)
    result = madtrace("record", "-q", "-o", out, *args)
    assert result.returncode == 0, result.stderr.decode()
    return out, result.stdout


def accesses(directory: str) -> dict:
    with open(os.path.join(directory, "meta.json")) as f:
        return json.load(f)["accesses"]


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_sh_exec_equals_direct_launch(tmp_path, variant):
    program = prog("data_heap", variant)
    direct, direct_out = record(tmp_path, "direct", "--data", "--", program)
    wrapped, wrapped_out = record(tmp_path, "wrapped", "--data", "--", "/bin/sh", "-c",
                                  f"exec {shlex.quote(program)}")
    assert wrapped_out == direct_out
    image = os.path.join(wrapped, "exec.1")
    d, w = summary_json(direct), summary_json(image)
    assert w["calls"] == d["calls"] and w["calls"]["chase"] == 1
    assert accesses(image) == accesses(direct)   # per instruction, loads and stores
    assert w["dropped_events"] == 0
    first = summary_json(wrapped)
    assert first["outcome"] == "exec"
    assert [i["dir"] for i in first["images"]] == [".", "exec.1"]
    assert first["images"][1]["accesses"] == sum(c["L"] + c["S"] for c in accesses(direct).values())


def test_script_that_execs_and_pending_function(tmp_path):
    program = prog("calls_recursion", "O0-pie")
    script = tmp_path / "launch.sh"
    script.write_text(f"#!/bin/sh\n# a launcher as users write them\nexec {shlex.quote(program)} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    direct, direct_out = record(tmp_path, "direct", "-f", "fib", "-f", "is_*", "--", program)
    # fib and is_* are not defined by the shell: pending until the exec brings them
    wrapped, wrapped_out = record(tmp_path, "wrapped", "-f", "fib", "-f", "is_*", "--", str(script))
    assert wrapped_out == direct_out
    assert summary_json(os.path.join(wrapped, "exec.1"))["calls"] == summary_json(direct)["calls"]
    assert summary_json(direct)["calls"]["fib"] == 21891


def test_function_never_matched_is_one_error_at_the_end(tmp_path):
    program = prog("calls_recursion", "O0-pie")
    out = str(tmp_path / "t")
    result = madtrace("record", "-q", "-o", out, "-f", "fib", "-f", "no_such_fn", "--",
                      "/bin/sh", "-c", f"exec {shlex.quote(program)}")
    one_line_error(result, 16, "no function matches 'no_such_fn' in any image or library")
    assert summary_json(os.path.join(out, "exec.1"))["calls"]["fib"] == 21891
    assert summary_json(os.path.join(out, "exec.1"))["unmatched_functions"] == ["no_such_fn"]


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_dlopen_library_traced_with_pattern_given_before_the_load(tmp_path, variant):
    """-f 'libmtplug.so:plug_*' names a library the program dlopens later: pending
    (gdb's pending breakpoints) until the loader maps it, then traced before its
    first call; counts equal callgrind's."""
    from .oracles import callgrind_calls, program_output
    argv = [prog("dlopen_calls", variant), os.path.join(os.path.dirname(prog("churn")),
                                                        "libmtplug.so"), "200"]
    patterns = ["local_work", "libmtplug.so:plug_*"]
    native = program_output(argv)
    out = str(tmp_path / "t")
    result = madtrace("record", "-q", "-o", out, *[a for p in patterns for a in ("-f", p)], "--", *argv)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == native.stdout
    expected = {k: v for k, v in callgrind_calls(argv, ["local_work", "libmtplug.so:plug_run",
                                                        "libmtplug.so:plug_step"]).items() if v}
    got = {k: v for k, v in summary_json(out)["calls"].items() if v}
    assert got == expected and expected["plug_step"] == 201


SLOW_INIT = os.path.join(os.path.dirname(prog("data_heap", "O2-nopie")), "libmtslowinit.so")
SLOW_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
long table[4096];
int main(void) {
    long sum = 0;
    for (long i = 0; i < 4096; i++) table[i] = i * 7 % 1000;
    for (long i = 0; i < 4096; i++) sum += table[(i * 13) % 4096];
    char *heap = malloc(100);
    sprintf(heap, "sum=%ld", sum);
    puts(heap);
    free(heap);
    return 0;
}
"""


@pytest.mark.parametrize("how", ["launch", "exec"])
def test_the_program_runs_on_when_the_tracer_is_killed_before_its_entry_point(tmp_path, how):
    """madtrace is SIGKILLed while the dynamic loader runs the constructor of a
    library the program needs (between the exec and the entry point, where
    tracing starts): the program, launched or reached through sh's exec, goes
    on to its entry and finishes with its native output (a breakpoint at the
    entry killed it with SIGTRAP).  The same run with madtrace alive records
    the program."""
    import signal
    import subprocess
    import time
    from .util import MADTRACE, ROOT
    source = tmp_path / "slow.c"
    source.write_text(SLOW_PROGRAM)
    program = str(tmp_path / "slow")
    subprocess.run(["gcc", "-O1", "-o", program, str(source), "-Wl,--no-as-needed", SLOW_INIT,
                    "-Wl,-rpath," + os.path.dirname(SLOW_INIT)], check=True, timeout=60)
    env = dict(os.environ, MT_SLOW_INIT_MS="1500", PYTHONPATH=ROOT)
    argv = [program] if how == "launch" else ["/bin/sh", "-c", f"exec {shlex.quote(program)}"]
    native = subprocess.run(argv, capture_output=True, timeout=60, env=env)
    assert native.returncode == 0 and native.stdout.startswith(b"sum=")
    tracer = subprocess.Popen(MADTRACE + ["record", "--data", "-o", str(tmp_path / "t"), "--", *argv],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        if how == "exec":
            # in the new image's loader once madtrace says the exec came (on a loaded
            # machine, a fixed pause ended while madtrace still set up sh's tracing)
            for line in tracer.stderr:
                if b"the target called exec" in line:
                    break
            time.sleep(0.3)                  # the constructor sleeps 1.5 s
        else:
            time.sleep(0.8)                  # the constructor sleeps until 1.5 s
        assert tracer.poll() is None
        os.kill(tracer.pid, signal.SIGKILL)
        out, _ = tracer.communicate(timeout=60)   # to EOF: the program holds the pipe
    finally:
        if tracer.poll() is None:
            tracer.kill()
    assert out == native.stdout
    alive = subprocess.run(MADTRACE + ["record", "-q", "--data", "-o", str(tmp_path / "a"), "--",
                                       *argv], capture_output=True, timeout=120, env=env)
    assert alive.returncode == 0, alive.stderr
    assert alive.stdout == native.stdout
    traced = tmp_path / "a" if how == "launch" else tmp_path / "a" / "exec.1"
    assert summary_json(traced)["calls"]["main"] == 1
