# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace ctl PID COMMAND [ARGS...]"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from ..errors import UsageError
from .options import parse_pid

NAME = "ctl"
HELP = ("send one REPL command to the madtrace daemon that traces PID (e.g. instrument tick, "
        "status, calls --json, stop); 'ctl PID help' lists the commands")


def add_arguments(parser) -> None:
    parser.add_argument("pid", help="process traced by the daemon")
    parser.add_argument("words", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS...]")


def run(args) -> int:
    from ..live.parser import parse
    from ..daemon.transport import DaemonClient
    pid = parse_pid(args.pid)
    words = list(args.words) + list(args.target_command)
    if not words:
        raise UsageError("ctl needs a command, e.g. madtrace ctl PID status")
    invocation = parse(shlex.join(words))   # malformed commands fail before connecting
    command = invocation.command
    if command.side == "frontend":
        if command.name == "quit":
            raise UsageError("quit is for the REPL; to end the daemon use: madtrace ctl PID stop")
        text = command.run_frontend(None, invocation.args)
        if text:
            print(text)
        return 0
    client = DaemonClient(pid)
    try:
        reply = client.execute(invocation)
    finally:
        client.close()
    if not reply.ok:
        print(f"madtrace: {reply.error}", file=sys.stderr)
        return reply.code or 1
    if invocation.json:
        print(json.dumps(reply.data))
    elif reply.text:
        print(reply.text)
    return 0
