"""Entry point of the ``madtrace`` (and ``tracer``) command.

Each subcommand lives in its own module exposing ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``.  ``madtrace -- CMD`` and
``madtrace [options] -- CMD`` are the ``run`` subcommand (record, then print a
summary).  Every madtrace error is printed as one line and mapped to its
distinct exit code (``madtrace.errors``); set MADTRACE_DEBUG=1 for tracebacks.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from .. import __version__
from ..errors import CorruptTraceError, MadtraceError, OutputError, UsageError

# command name -> its module (imported when that command runs, or for --help: a
# command such as ctl loads nothing the others need)
COMMAND_MODULES = {"run": "cmd_run", "record": "cmd_record", "attach": "cmd_attach",
                   "summary": "cmd_summary", "export": "cmd_export", "query": "cmd_query",
                   "report": "cmd_report", "repl": "cmd_repl", "daemon": "cmd_daemon",
                   "ctl": "cmd_ctl", "cache": "cmd_cache", "doctor": "cmd_doctor",
                   "diff": "cmd_diff"}
INTERNAL_ERROR_EXIT = 70
# errors of writing, whatever wrote: a read-only file system, a full disk, a quota
WRITE_ERRNOS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def command_module(name: str):
    module = importlib.import_module(f".{COMMAND_MODULES[name]}", __package__)
    if module.NAME != name:
        raise AssertionError(f"{module.__name__} is command {module.NAME!r}, not {name!r}")
    return module


class _Commands(dict):
    """name -> module, each module imported on first access."""

    def __missing__(self, name: str):
        if name not in COMMAND_MODULES:
            raise KeyError(name)
        module = self[name] = command_module(name)
        return module

    def __contains__(self, name) -> bool:
        return name in COMMAND_MODULES

    def __iter__(self):
        return iter(COMMAND_MODULES)

    def items(self):
        return [(name, self[name]) for name in COMMAND_MODULES]


COMMANDS = _Commands()


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, our exit code for usage errors
        # printed after "madtrace: ": a command's parser names its command
        command = self.prog.removeprefix("madtrace").strip()
        raise UsageError(f"{command}: {message}" if command else message)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of command ``only`` (its module alone is loaded)."""
    parser = _Parser(prog="madtrace", description=(
        "Trace function calls and data memory accesses of a Linux x86-64 program "
        "with ptrace, without recompiling it."),
        epilog="madtrace -- CMD ARGS...   records CMD and prints a summary")
    parser.add_argument("--version", action="version", version=f"madtrace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES if only is None else [only]:
        module = COMMANDS[name]
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
    return parser


def normalise_argv(argv: list[str]) -> list[str]:
    """``madtrace [opts] -- CMD`` → ``madtrace run [opts] -- CMD``."""
    if not argv:
        return argv
    first = argv[0]
    if first in COMMANDS or first in ("-h", "--help", "--version"):
        return argv
    if first == "--" or first.startswith("-"):
        return ["run"] + argv
    return argv


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split at the first ``--``: madtrace's own arguments, the target command."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


# options of `madtrace daemon` that the resident process does not run for a client
NOT_FORWARDED = frozenset({"--resident", "--stop-resident", "-h", "--help"})


def through_resident(argv: list[str]) -> tuple[int | None, str]:
    """``madtrace daemon PID ...`` run by the resident process when one listens
    (before this command's parser and tracer are imported: the worker parses
    and says the same): (its exit code, "") or (None, why it was not)."""
    own = split_command(argv)[0]
    if own[:1] != ["daemon"] or NOT_FORWARDED.intersection(own):
        return None, ""
    from ..daemon import resident_client
    if resident_client.in_worker:
        return None, ""
    return resident_client.run_in_resident(argv)


def main(argv: list[str] | None = None) -> int:
    argv = normalise_argv(list(sys.argv[1:] if argv is None else argv))
    try:
        code, not_resident = through_resident(argv)
        if code is not None:
            return code
        own, target = split_command(argv)
        parser = build_parser(own[0] if own and own[0] in COMMAND_MODULES else None)
        args = parser.parse_args(own)
        if args.command is None:
            parser.print_help(sys.stderr)
            raise UsageError("a command is required, e.g. madtrace -- ./prog args")
        args.target_command = target
        args.not_resident = not_resident    # why the resident did not run it (cmd_daemon)
        return COMMANDS[args.command].run(args)
    except MadtraceError as exc:
        if os.environ.get("MADTRACE_DEBUG"):
            import traceback
            traceback.print_exc()
        print(f"madtrace: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("madtrace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 141
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS or os.environ.get("MADTRACE_DEBUG"):
            raise_or_internal(exc)
            return INTERNAL_ERROR_EXIT
        # an output that cannot be written, wherever it is written from
        print(f"madtrace: cannot write {exc.filename or 'an output'}: {exc.strerror}",
              file=sys.stderr)
        return OutputError.exit_code
    except Exception as exc:  # a bug: one line unless asked for more
        if store_file_unreadable(exc) and not os.environ.get("MADTRACE_DEBUG"):
            print(f"madtrace: a file of the trace's store is corrupt ({first_line(exc)}): remove "
                  "the store/ folder of the trace directory and it is rebuilt from the trace files",
                  file=sys.stderr)
            return CorruptTraceError.exit_code
        raise_or_internal(exc)
        return INTERNAL_ERROR_EXIT


def store_file_unreadable(exc: BaseException) -> bool:
    """DuckDB failed on madtrace's own SQL over a store: a damaged data page of one
    of its Parquet files (footers are checked when connecting; the errors of a
    user's SQL are QueryErrors before they get here), whichever command read it."""
    return type(exc).__module__.lstrip("_").startswith("duckdb")


def first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def raise_or_internal(exc: BaseException) -> None:
    """A bug of madtrace's: one line, or the traceback with MADTRACE_DEBUG=1."""
    if os.environ.get("MADTRACE_DEBUG"):
        raise exc
    print(f"madtrace: internal error: {type(exc).__name__}: {exc} "
          "(set MADTRACE_DEBUG=1 for a traceback)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
