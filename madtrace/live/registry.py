# SPDX-License-Identifier: GPL-2.0-or-later
"""The REPL's commands: a base class and a registry filled by the modules of
``madtrace.live.commands`` (each one defines and registers one command).

A command says where it runs: ``side = "tracer"`` commands run in the tracer
thread, inside the run loop (``run(session, args)`` -> JSON-able data, then
``render(data)`` -> text); ``side = "frontend"`` commands (help, sleep,
quit) run where the user is (``run_frontend(frontend, args)``).  Its class
docstring is its help text; ``summary`` is the one-line description listed
by ``help``.
"""

from __future__ import annotations

import inspect

# a tracer command returns this to answer only when the session has ended
# (detach, kill): its reply is the session's final message
WAIT_FOR_END = object()


class Command:
    name = ""
    aliases: tuple[str, ...] = ()
    arguments = ""                 # usage after the name, e.g. "GLOB"
    summary = ""
    min_args = 0
    max_args: int | None = 0       # None: no limit
    json_form = False              # accepts --json
    side = "tracer"                # "tracer" or "frontend"
    stops_target = False           # needs every thread stopped while it runs
    # its prepare may stop the target on its own (LiveSession.stop_for): it runs alone
    # in its batch, so that no other command of the batch changes what it prepared
    stops_ahead = False
    completes: str | None = None   # what its arguments complete to (see LiveSession.complete)
    flags: tuple[str, ...] = ()    # its own options, e.g. ("--force",)

    def check(self, args: list[str]) -> None:
        """Raise a one-line UsageError for a malformed argument list (at parse time,
        before anything reaches the target or the daemon)."""

    def completion_kind(self, args: list[str]) -> str | None:
        """What the next argument completes to, after ``args`` (the words typed):
        a kind of name (see LiveSession.complete), "commands" or "paths"."""
        return self.completes

    def keywords(self, args: list[str]) -> list[str]:
        """Fixed words the next argument may be, after ``args`` (with the kind's names)."""
        return []

    def localize(self, args: list[str]) -> list[str]:
        """``args`` as the daemon must see them (paths relative to the client's
        directory made absolute)."""
        return list(args)

    def prepare(self, session, args: list[str]) -> None:
        """Tracer side, before the target is stopped (it still runs): the work that
        needs no stopped thread (reading files, planning), so that the stop is
        short (``stops_ahead``: also a brief stop of its own).  A failure here is
        the command's reply; nothing was changed for it.""" 

    def execute(self, session, invocation):
        """Tracer side: run the invocation (flags included); most commands only
        need ``run``."""
        return self.run(session, invocation.args)

    def run(self, session, args: list[str]):
        raise NotImplementedError

    def run_frontend(self, frontend, args: list[str]):
        raise NotImplementedError

    def render(self, data) -> str:
        return "" if data is None else str(data)

    @property
    def usage(self) -> str:
        flags = "".join(f" [{flag}]" for flag in self.flags)
        json = " [--json]" if self.json_form else ""
        return f"{self.name} {self.arguments}{flags}{json}".replace("  ", " ").strip()

    @property
    def description(self) -> str:
        return inspect.cleandoc(type(self).__doc__ or self.summary)


_COMMANDS: dict[str, Command] = {}


def register(cls: type[Command]) -> type[Command]:
    command = cls()
    for name in (command.name, *command.aliases):
        if name in _COMMANDS:
            raise ValueError(f"REPL command {name!r} registered twice")
        _COMMANDS[name] = command
    return cls


def _load() -> None:
    from . import commands  # noqa: F401  (its modules register themselves)


def lookup(name: str) -> Command | None:
    _load()
    return _COMMANDS.get(name)


def all_commands() -> list[Command]:
    """Each command once, by name."""
    _load()
    return sorted({id(c): c for c in _COMMANDS.values()}.values(), key=lambda c: c.name)


def names() -> list[str]:
    """Every name a command answers to, aliases included."""
    _load()
    return sorted(_COMMANDS)
