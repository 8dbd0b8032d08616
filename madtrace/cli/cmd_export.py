"""madtrace export DIR --format madt|lackey|chrome|parquet [--raw] [--max-events N] [-o FILE]
[--force]

The formats are the modules of madtrace/exports/ (one each, with their options)."""

from __future__ import annotations

from ..exports import FORMATS, help_text
from ..trace.meta import read_meta

NAME = "export"
HELP = "write a trace in another format: " + help_text()


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="trace directory written with --data")
    parser.add_argument("--format", choices=tuple(FORMATS), required=True)
    for export in FORMATS.values():
        if export.add_arguments is not None:
            export.add_arguments(parser)
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="output file (default: stdout); parquet: the directory to create")
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


def run(args) -> int:
    read_meta(args.directory)   # a clear error for anything but a trace directory
    return FORMATS[args.format].write(args)
