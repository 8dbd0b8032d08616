# SPDX-License-Identifier: GPL-2.0-or-later
"""The command reference (docs/commands.md), made from the argparse definitions of
every command and the REPL's command registry, so that the documented options
cannot drift from the ones the parser takes.

``python3 -m madtrace.cli.reference [FILE]`` writes it, and ``--man FILE`` the manual
page madtrace(1) made from the same definitions (``make docs`` writes both);
tests/test_docs.py checks that the committed files are what this makes.
"""

from __future__ import annotations

import argparse
import inspect
import sys

from .. import errors
from .main import COMMAND_MODULES, build_parser

HEADER = """\
# Command reference

Made by `make docs` from the option definitions of each command
(`madtrace/cli/reference.py`); `madtrace COMMAND --help` prints the same.
[The user's guide](../README.md) shows them in use; [usage.md](usage.md) explains
what each command does in detail.
"""


WIDTH = 90


class _Collector(argparse.HelpFormatter):
    """A help formatter that keeps the arguments it is given, in order."""

    seen: list[argparse.Action] = []

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=WIDTH)      # the terminal's width would change the page

    def add_argument(self, action: argparse.Action) -> None:
        type(self).seen.append(action)
        super().add_argument(action)


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    class Collector(_Collector):
        seen: list[argparse.Action] = []
    parser.formatter_class = Collector
    parser.format_help()
    return Collector.seen


def _help(action: argparse.Action, prog: str) -> str:
    """The help text as --help prints it (argparse's own %-expansion)."""
    values = {**vars(action), "prog": prog}
    return (action.help or "") % values if "%" in (action.help or "") else (action.help or "")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _argument(action: argparse.Action) -> str:
    metavar = action.metavar if isinstance(action.metavar, str) else None
    if not action.option_strings:
        return f"`{metavar or action.dest.upper()}`"
    if action.nargs == 0:
        return ", ".join(f"`{o}`" for o in action.option_strings)
    if metavar is None and action.choices is not None:
        metavar = "|".join(str(c) for c in action.choices)
    metavar = metavar or action.dest.upper()
    return ", ".join(f"`{o} {metavar}`" for o in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def _command(name: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = [f"## madtrace {name}", "", _cell(parser.description or ""), "", "```",
             parser.format_usage().strip().removeprefix("usage: "), "```", ""]
    rows = [a for a in _actions(parser) if a.help is not argparse.SUPPRESS and a.dest != "help"]
    if rows:
        lines += ["| argument | meaning | default |", "| --- | --- | --- |"]
        lines += [f"| {_argument(a)} | {_cell(_help(a, parser.prog))} | {_default(a)} |" for a in rows]
        lines.append("")
    return lines


def _repl_commands() -> list[str]:
    from ..live.registry import all_commands
    lines = ["## REPL and daemon commands", "",
             "Typed at `madtrace repl PID`, sent with `madtrace ctl PID COMMAND`, or read "
             "from a file with `--batch FILE`. `help CMD` prints each one's text below.", ""]
    for command in all_commands():
        names = " / ".join(f"`{n}`" for n in (command.name, *command.aliases))
        usage = " ".join(filter(None, [command.name, command.arguments,
                                       "[--json]" if command.json_form else "",
                                       *(f"[{f}]" for f in command.flags)]))
        lines += [f"### {names}", "", f"`{usage}`: {_cell(command.summary)}", ""]
        for paragraph in inspect.cleandoc(command.__doc__ or "").split("\n\n"):
            if not paragraph.strip():
                continue
            if any(line.startswith("  ") for line in paragraph.splitlines()):
                lines += ["```", paragraph.strip("\n"), "```", ""]   # laid out: kept as it is
            else:
                lines += [_cell(paragraph), ""]
    return lines


def _error_classes() -> list[type[errors.MadtraceError]]:
    """Each error class with an exit code of its own, by code."""
    return sorted({cls for cls in vars(errors).values()
                   if isinstance(cls, type) and issubclass(cls, errors.MadtraceError)
                   and "exit_code" in vars(cls)}, key=lambda cls: cls.exit_code)


def _meaning(cls: type[errors.MadtraceError]) -> str:
    if cls is errors.MadtraceError:
        return "an error of madtrace's that has no class of its own"
    return cls.__doc__ or ""


def _exit_codes() -> list[str]:
    lines = ["## Exit codes", "",
             "madtrace exits with the target's status (128+N when it died of signal N); "
             "its own errors have these codes, each printed as one line on stderr.", "",
             "| code | error | meaning |", "| --- | --- | --- |"]
    lines += [f"| {cls.exit_code} | `{cls.__name__}` | {_cell(_meaning(cls))} |"
              for cls in _error_classes()]
    lines += ["| 70 | internal error | a bug of madtrace's: `MADTRACE_DEBUG=1` shows the "
              "traceback |", "| 130 | interrupted | Ctrl-C while madtrace itself waited |", ""]
    return lines


def markdown() -> str:
    lines = [HEADER, "Commands: " + ", ".join(
        f"[{name}](#madtrace-{name})" for name in COMMAND_MODULES) + ".", ""]
    for name, parser in _commands():
        lines += _command(name, parser)
    lines += _repl_commands()
    lines += _exit_codes()
    return "\n".join(lines).rstrip() + "\n"


def _roff(text: str) -> str:
    text = " ".join(text.split()).replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    result = []
    for name in COMMAND_MODULES:
        parser = build_parser(name)
        choices = next(a.choices for a in _actions(parser) if isinstance(a.choices, dict))
        result.append((name, choices[name]))
    return result


def man() -> str:
    """madtrace(1) in roff: the commands, their options, the REPL's commands, exit codes."""
    out = [".TH MADTRACE 1 \"\" \"madtrace\" \"User Commands\"", ".SH NAME",
           "madtrace, tracer \\- " + _roff(
               "trace the function calls and data memory accesses of a Linux x86-64 program"),
           ".SH SYNOPSIS", ".B madtrace", "[\\fIOPTIONS\\fR] \\-\\- \\fICMD\\fR [\\fIARGS\\fR]",
           ".br", ".B madtrace", "\\fICOMMAND\\fR [\\fIOPTIONS\\fR] ...", ".SH DESCRIPTION",
           _roff("madtrace launches a program, or attaches to a running one, with ptrace; counts "
                 "and times the calls of the functions chosen; with --data records every load "
                 "and store of the program's data, named, in the call that made it; and writes "
                 "a trace directory that summary, report, query and export read."),
           ".SH COMMANDS"]
    for name, parser in _commands():
        out += [f".SS madtrace {name}", _roff(parser.description or ""), ".PP", ".nf",
                *(_roff(line) for line in
                  parser.format_usage().strip().removeprefix("usage: ").splitlines()), ".fi"]
        for action in _actions(parser):
            if action.help is argparse.SUPPRESS or action.dest == "help":
                continue
            out += [".TP", "\\fB" + _roff(_argument(action).replace("`", "")) + "\\fR",
                    _roff(_help(action, parser.prog))]
    out += [".SH REPL AND DAEMON COMMANDS",
            _roff("Typed at madtrace repl PID, sent with madtrace ctl PID COMMAND, or read from a "
                  "file with --batch FILE.")]
    from ..live.registry import all_commands
    for command in all_commands():
        out += [".TP", "\\fB" + _roff(" ".join(filter(None, [command.name, command.arguments])))
                + "\\fR", _roff(command.summary)]
    out += [".SH EXIT STATUS",
            _roff("The target's status (128+N when it died of signal N), or one of these codes "
                  "for madtrace's own errors, each printed as one line on stderr:")]
    for cls in _error_classes():
        out += [".TP", f"\\fB{cls.exit_code}\\fR", _roff(_meaning(cls))]
    out += [".TP", "\\fB70\\fR", _roff("an internal error (MADTRACE_DEBUG=1 prints the traceback)"),
            ".SH FILES", _roff("~/.cache/madtrace: the symbol cache (madtrace cache list|clear); "
                               "$XDG_RUNTIME_DIR/madtrace/PID.sock: a daemon's socket."),
            ".SH SEE ALSO", _roff("docs/usage.md, docs/commands.md and docs/trace-format.md in "
                                  "madtrace's source tree.")]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--man"]:
        text, argv = man(), argv[1:]
    else:
        text = markdown()
    if argv:
        with open(argv[0], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
