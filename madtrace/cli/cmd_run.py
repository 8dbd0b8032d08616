"""madtrace [options] -- CMD ARGS...: record into a fresh directory, print a summary."""

from __future__ import annotations

import os
import sys

from ..trace import store
from ..trace.meta import read_meta
from . import cmd_record
from .cmd_summary import print_human_summary, totals_of_recording

NAME = "run"
HELP = "record CMD into a new trace directory, then print a human summary"


def add_arguments(parser) -> None:
    cmd_record.add_arguments(parser)
    parser.set_defaults(output=None)


def run(args) -> int:
    output = args.output or store.default_trace_dir()
    recording, status = cmd_record.record(args, output)
    if recording.flight is not None:        # the snapshots are in output: the last one
        taken = recording.flight.recorder.taken
        if not taken:
            return 0 if status is None else status
        output = os.path.join(output, taken[-1]["directory"])
        recording.meta = read_meta(output)
    print_human_summary(recording.meta, output, sys.stderr, totals_of_recording(output))
    return 0 if status is None else status
