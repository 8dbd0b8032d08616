# SPDX-License-Identifier: GPL-2.0-or-later
"""--follow-forks: each fork child is traced like the parent, into DIR/fork.<pid>/.

Oracles, per process: callgrind and lackey with --trace-children=yes (one
output file per process).  A child's callgrind counts include what it
inherited at fork (its parent's calls before the fork); madtrace records each
call once, in the process that made it, so the child's callgrind count is
madtrace's plus the parent's calls before the fork.  Lackey's child log starts
at the fork: the child's accesses, per instruction, equal madtrace's child
trace.  Both sides write the same global and heap block after the fork; each
sees only its own writes (the program's output equals an untraced run)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from .oracles import CALLGRIND_OPTIONS, VALGRIND, parse_callgrind, parse_lackey, select_calls
from .test_data import named_like_madtrace, sections
from .util import madtrace, prog, summary_json
from madtrace.binary.elf import ElfImage

N = "60"
BEFORE_FORK = 10      # fork_data.c: walk(block, 10, 1) before fork(): 10 calls of bump


def per_process(tmp_path, tool_args: list[str], argv: list[str]) -> tuple[dict, str]:
    """Run ``argv`` under valgrind with --trace-children=yes; returns ({"parent" |
    "child": output file}, stderr)."""
    out = tmp_path / "vg"
    out.mkdir()
    run = subprocess.run([VALGRIND, *tool_args, "--trace-children=yes",
                          f"--log-file={out}/log.%p", *argv], capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr
    stderr = run.stderr.decode()
    roles = {int(pid): role for pid, role in re.findall(r"pid (\d+) (parent|child)", stderr)}
    return roles, stderr


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_follow_forks_calls_equal_callgrind(tmp_path, variant):
    argv = [prog("fork_data", variant), N]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    result = madtrace("record", "-q", "--follow-forks", "-f", "bump", "-o", str(tmp_path / "t"),
                      "--", *argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout == native.stdout
    parent = summary_json(tmp_path / "t")
    [child_entry] = parent["processes"]
    child = summary_json(tmp_path / "t" / child_entry["dir"])
    assert child["outcome"] == "exited" and child["exit_status"] == 5
    roles, _ = per_process(tmp_path, [*[o for o in CALLGRIND_OPTIONS if "trace-children" not in o],
                                      f"--callgrind-out-file={tmp_path}/vg/cg.%p"], argv)
    counts = {}
    for pid, role in roles.items():
        entries, _ = parse_callgrind(f"{tmp_path}/vg/cg.{pid}")
        counts[role] = select_calls(entries, os.path.realpath(argv[0]), ["bump"])["bump"]
    assert parent["calls"]["bump"] == counts["parent"] == BEFORE_FORK + int(N)
    assert child["calls"]["bump"] == counts["child"] - BEFORE_FORK == 3 * int(N)


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_follow_forks_accesses_equal_lackey(tmp_path, variant):
    path = prog("fork_data", variant)
    argv = [path, N]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    result = madtrace("record", "-q", "--follow-forks", "--data", "--no-functions",
                      "-o", str(tmp_path / "t"), "--", *argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout == native.stdout
    with open(tmp_path / "t" / "meta.json") as f:
        meta = json.load(f)
    [child_entry] = meta["processes"]
    with open(tmp_path / "t" / child_entry["dir"] / "meta.json") as f:
        child_meta = json.load(f)
    traces = {"parent": meta["accesses"], "child": child_meta["accesses"]}
    roles, stderr = per_process(tmp_path, ["--tool=lackey", "--trace-mem=yes"], argv)
    block = int(re.search(r"block (0x[0-9a-f]+)", stderr).group(1), 16)
    image = ElfImage.load(path)
    text = image.section(".text")
    ranges = sections(path, ".data", ".bss") + [(block, block + 16 * 8)]
    for pid, role in roles.items():
        oracle = parse_lackey(f"{tmp_path}/vg/log.{pid}", (text.address, text.address + text.size),
                              ranges)
        got, expected = named_like_madtrace(path, oracle, traces[role])
        assert got == expected, role
        assert sum(c["S"] for c in got.values()) >= int(N), role
