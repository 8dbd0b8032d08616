# SPDX-License-Identifier: GPL-2.0-or-later
"""Trace directories mangled as disks, copies and people mangle them: every
reader (summary, report, query, export) answers with a result or one line and
a defined exit code; never 70 ("internal error"), never a traceback.

Each seed copies a recorded trace and applies 1-3 mutations (truncate a file,
flip bytes, delete a file or folder, replace a file with garbage or with an
empty one, append junk); the commands run in this process (the CLI's main()),
so many seeds cost little.  `make test` runs FUZZ_SEEDS seeds (default 24);
`make bench` runs more (bench/bench_fuzz.py)."""

from __future__ import annotations

import contextlib
import io
import os
import random
import shutil

import pytest

from madtrace.cli.main import INTERNAL_ERROR_EXIT, main

from .util import madtrace, prog

SEEDS = int(os.environ.get("FUZZ_SEEDS", "24"))
COMMANDS = (
    ["summary", "{d}", "--json"],
    ["report", "{d}", "--kind", "calls"],
    ["report", "{d}", "--kind", "heatmap"],
    ["report", "{d}", "--kind", "alloc", "--json"],
    ["query", "{d}", "SELECT kind, count(*) FROM accesses GROUP BY 1"],
    ["export", "{d}", "--format", "madt", "-o", "{o}/madt.txt"],
    ["export", "{d}", "--format", "chrome", "-o", "{o}/chrome.json"],
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz") / "t"
    result = madtrace("record", "-q", "--data", "-o", str(out), "--", prog("data_heap", "O0-pie"))
    assert result.returncode == 0, result.stderr
    return out


def mutate(directory, rng: random.Random) -> list[str]:
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    done = []
    for _ in range(rng.randint(1, 3)):
        if not files:
            break
        path = rng.choice(files)
        size = path.stat().st_size if path.exists() else 0
        how = rng.choice(("truncate", "flip", "delete", "garbage", "empty", "append", "rmdir"))
        if not path.exists():
            continue
        if how == "truncate" and size:
            with open(path, "r+b") as f:
                f.truncate(rng.randrange(size))
        elif how == "flip" and size:
            data = bytearray(path.read_bytes())
            for _ in range(rng.randint(1, 16)):
                data[rng.randrange(size)] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
        elif how == "delete":
            path.unlink()
        elif how == "garbage":
            path.write_bytes(bytes(rng.randrange(256) for _ in range(max(size, 1))))
        elif how == "empty":
            path.write_bytes(b"")
        elif how == "append":
            with open(path, "ab") as f:
                f.write(bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))
        elif how == "rmdir" and path.parent != directory:
            shutil.rmtree(path.parent, ignore_errors=True)
        else:
            continue
        done.append(f"{how} {path.relative_to(directory)}")
    return done


def run_cli(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(args)
    return code, err.getvalue()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_mangled_trace_directory(pristine, tmp_path, seed):
    rng = random.Random(seed)
    directory = tmp_path / "t"
    shutil.copytree(pristine, directory)
    mutations = mutate(directory, rng)
    for command in COMMANDS:
        args = [a.format(d=directory, o=tmp_path) for a in command]
        code, err = run_cli(args)
        assert code != INTERNAL_ERROR_EXIT and "Traceback" not in err, (mutations, args, err)
        if code:
            # one error line, besides the notes about the store and the warnings that
            # a file cut short is read up to the cut (the error may come after them)
            messages = [line for line in err.splitlines() if line.startswith("madtrace: ")
                        and "building the store" not in line and "rebuilding" not in line
                        and "cut short" not in line and "what followed is lost" not in line
                        and "the mappings after it go unnamed" not in line]
            assert len(messages) == 1, (mutations, args, err)
