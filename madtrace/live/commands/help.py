# SPDX-License-Identifier: GPL-2.0-or-later
"""help [CMD]"""

from __future__ import annotations

from ...errors import UsageError
from .. import registry
from ..registry import Command, register


@register
class Help(Command):
    """Without an argument, list the commands; with one, describe it."""

    name = "help"
    arguments = "[CMD]"
    summary = "list the commands, or describe one"
    max_args = 1
    side = "frontend"
    completes = "commands"

    def run_frontend(self, frontend, args):
        if not args:
            width = max(len(c.usage) for c in registry.all_commands())
            lines = [f"  {c.usage:<{width}}  {c.summary}" for c in registry.all_commands()]
            return "\n".join(["commands (help CMD for details):"] + lines)
        command = registry.lookup(args[0])
        if command is None:
            raise UsageError(f"help: unknown command {args[0]!r}")
        aliases = f"\n(also: {', '.join(command.aliases)})" if command.aliases else ""
        return f"usage: {command.usage}\n{command.description}{aliases}"
