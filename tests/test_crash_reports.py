# SPDX-License-Identifier: GPL-2.0-or-later
"""A fault the program dies of is said where it struck (recording/crashes.py):
flight_requests ... segv writes to address 4 in main() after its last request.

Oracles: the program's own exit (SIGSEGV, status 139, as untraced), the
faulting address it wrote (4), and main's bounds in its symbol table: the
report names main, in the program's code without data tracing and in
madtrace's copy of main with it (main loads a traced global, so it runs
copied), at the copy of main's own instruction (where the thread goes on)."""

from __future__ import annotations

import json
import subprocess

import pytest

from madtrace.binary.elf import ElfImage

from .util import madtrace, prog


@pytest.mark.parametrize("options, copied", [(("--no-functions",), False),
                                             (("--no-functions", "--data"), True)])
def test_the_fault_a_program_dies_of_is_named(tmp_path, options, copied):
    argv = [prog("flight_requests", "O0-nopie"), "40", "-1", "segv"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    assert native.returncode == -11
    result = madtrace("record", "-o", str(tmp_path / "t"), *options, "--", *argv, timeout=120)
    assert result.returncode == 139 and result.stdout == native.stdout, result.stderr
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert meta["exit_signal"] == 11
    (report,) = meta["faults_delivered"]
    assert report["signal"] == "SIGSEGV" and report["address"] == 4 and report["code"] == 1
    assert ("page 0x0: not protected by the data engine" in report.get("address_note", "")) == copied
    (main,) = ElfImage.load(argv[0]).symbols_named("main")
    at = report["at"]
    # where the program goes on (its handler, had it one): main's own instruction
    assert main.address <= report["rip"] < main.address + main.size
    offset = report["rip"] - main.address
    if copied:          # it struck in the copy, at the copy of that instruction
        assert at.startswith("in madtrace's copy of main (")
        assert f", at the copy of main+{offset:#x} (" in at
        assert not main.address <= report["struck_at"] < main.address + main.size
    else:
        assert at.startswith(f"main+{offset:#x} (") and "struck_at" not in report
    line = [x for x in result.stderr.decode().splitlines() if "takes SIGSEGV" in x]
    assert len(line) == 1 and at in line[0] and "(address 0x4" in line[0], result.stderr
