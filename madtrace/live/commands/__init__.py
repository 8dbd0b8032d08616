# SPDX-License-Identifier: GPL-2.0-or-later
"""One module per REPL command; importing this package registers them all."""

from . import (calls, detach, examine, funcs, help, instrument, kill, maps, quit, regs, restore,  # noqa: F401
               save, sleep, snapshot, status, top, trace, watch)
