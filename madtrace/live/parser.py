# SPDX-License-Identifier: GPL-2.0-or-later
"""One REPL line -> an ``Invocation``, or a one-line ``UsageError``.

Grammar: shell-like words (quotes, ``#`` comments); the first word names a
command; ``--json`` anywhere selects the JSON form of commands that have
one, and the command's own flags (``save DIR --force``) may appear anywhere
too; any other word starting with ``--`` is an unknown option; the number of
remaining words must fit the command.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..errors import UsageError
from . import registry
from .registry import Command


@dataclass
class Invocation:
    command: Command
    args: list[str]
    json: bool
    line: str
    flags: frozenset = frozenset()

    def for_daemon(self) -> str:
        """The line to send to a daemon: the command's paths made absolute here,
        where the user is (the daemon runs in /)."""
        words = [self.command.name, *self.command.localize(self.args), *sorted(self.flags)]
        return shlex.join(words + (["--json"] if self.json else []))


def _arity(command: Command) -> str:
    lo, hi = command.min_args, command.max_args
    if hi == 0:
        return "no arguments"
    if hi is None:
        return f"at least {lo} argument{'s' if lo != 1 else ''}"
    if lo == hi:
        return f"{lo} argument{'s' if lo != 1 else ''}"
    return f"{lo} to {hi} arguments"


def parse(line: str) -> Invocation | None:
    """None for a blank line or a comment."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError as exc:
        raise UsageError(f"malformed command: {str(exc).lower()}") from None
    if not words:
        return None
    name, rest = words[0], words[1:]
    command = registry.lookup(name)
    if command is None:
        raise UsageError(f"unknown command {name!r} (type 'help' for the list)")
    want_json = "--json" in rest
    rest = [w for w in rest if w != "--json"]
    if want_json and not command.json_form:
        raise UsageError(f"{command.name} has no --json form")
    flags = frozenset(w for w in rest if w in command.flags)
    rest = [w for w in rest if w not in command.flags]
    for word in rest:
        if word.startswith("--"):
            raise UsageError(f"{command.name}: unknown option {word} (usage: {command.usage})")
    n, lo, hi = len(rest), command.min_args, command.max_args
    if n < lo or (hi is not None and n > hi):
        raise UsageError(f"{command.name} takes {_arity(command)}, not {n} (usage: {command.usage})")
    command.check(rest)
    return Invocation(command, rest, want_json, line.strip(), flags)
