# SPDX-License-Identifier: GPL-2.0-or-later
"""export --format chrome: calls and accesses as a Chrome/Perfetto JSON timeline
(trace/chrome.py writes it)."""

from __future__ import annotations

import sys

from ..errors import UsageError, writing
from . import Export, check_output

DEFAULT_MAX_EVENTS = 1_000_000


def _arguments(parser) -> None:
    parser.add_argument(
        "--max-events",
        type=int,
        metavar="N",
        default=DEFAULT_MAX_EVENTS,
        help=f"chrome: at most N events (default {DEFAULT_MAX_EVENTS}); a larger trace is "
        "exported whole at a coarser grain (no accesses, then only the calls longer than a "
        "duration), said on stderr and in the file",
    )
    parser.add_argument(
        "--first",
        action="store_true",
        help="chrome: beyond --max-events, every event up to the time the budget is reached "
        "(the start of the run, in full) instead of the whole run",
    )


def _write(args) -> int:
    from ..trace.chrome import write_chrome

    if args.max_events < 1:
        raise UsageError("--max-events must be >= 1")

    def warn(message: str) -> None:
        print(f"madtrace: export: {message}", file=sys.stderr, flush=True)

    if args.output:
        check_output(args.output, args.force)
        with writing(args.output), open(args.output, "w") as out:
            write_chrome(args.directory, out, args.max_events, warn, args.first)
    else:
        write_chrome(args.directory, sys.stdout, args.max_events, warn, args.first)
    return 0


EXPORT = Export(
    name="chrome",
    help="its calls and accesses as a Chrome/Perfetto JSON timeline",
    order=2,
    write=_write,
    add_arguments=_arguments,
)
