# SPDX-License-Identifier: GPL-2.0-or-later
"""One module per REPL command; importing this package registers them all."""

from . import (calls, detach, examine, funcs, help, instrument, kill, maps,  # noqa: F401
               quit, regs, restore, save, sleep, status, top, trace, watch)
