# SPDX-License-Identifier: GPL-2.0-or-later
"""The documentation: the command reference is the one the parsers make, every
relative link leads somewhere, the README stays a user's guide, and no page
says when or in which round of work it was written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from madtrace.cli import reference

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")),
         *sorted((ROOT / "bench" / "results").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# what a journal leaves: dates, commit hashes, named runs, issue numbers, rounds of work
JOURNAL = {
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a commit hash": re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w/-])"),
    "an issue number": re.compile(r"\bissue \d+", re.I),
    "a named run": re.compile(r"(?<!-)\b[Rr]uns? [A-Z]\d?\b(?! *[=:(]| seconds)"),
    "a round of work": re.compile(
        r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
        r"twelfth|this|last|previous|next) session\b(?! (of|that|is|ends|starts|on))", re.I),
}


def test_command_reference_is_what_the_parsers_make():
    committed = (ROOT / "docs" / "commands.md").read_text()
    assert committed == reference.markdown(), "docs/commands.md is stale: run `make docs`"


def test_manual_page_is_what_the_parsers_make():
    committed = (ROOT / "docs" / "man" / "madtrace.1").read_text()
    assert committed == reference.man(), "docs/man/madtrace.1 is stale: run `make docs`"


def test_the_reference_lists_every_option_of_record():
    text = reference.markdown()
    section = text.split("## madtrace record", 1)[1].split("\n## ", 1)[0]
    for option in ("--data", "--data-engine", "--follow-forks", "--no-store", "--only", "--force"):
        assert f"`{option}" in section


def test_readme_is_a_users_guide():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines: the design goes to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    missing = [target for target in LINK.findall(page.read_text())
               if "://" not in target and not (page.parent / target).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_reads_as_a_journal(page):
    text = page.read_text()
    found = [f"{what}: {m.group(0)!r}" for what, pattern in JOURNAL.items()
             for m in pattern.finditer(text)]
    assert not found, f"{page.relative_to(ROOT)}: {found[:10]}"


def test_the_journal_patterns_find_what_they_are_for():
    samples = {"a date": "measured 2026-11-25 on", "a commit hash": "main at 012942b and",
               "an issue number": "against issue 18's goals", "a named run": "Run G, after",
               "a round of work": "the eleventh session found"}
    for what, sample in samples.items():
        assert JOURNAL[what].search(sample), what
    for innocent in ("0x7f12345678", "run 5 times", "let it run S seconds", "--runs N", "a live session of the user's",
                     "XXH3-64 checksum", "the session ends", "deadbeef"):
        assert not any(p.search(innocent) for p in JOURNAL.values()), innocent
