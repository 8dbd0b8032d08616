# SPDX-License-Identifier: GPL-2.0-or-later
"""The C parts of madtrace, loaded with ctypes: the data engine's fault loop
(process/fault_loop.c), the ring drain (rings/ring_drain.c), the call
replay (trace/replay.c) and the footprint core (analysis/footprint.c).
``make`` builds each into build/native/; ``load`` opens one and says which
make target builds it when it is missing.  Each user declares the
signatures it calls."""

from __future__ import annotations

import ctypes
import os

from .errors import TracerInternalError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE_DIR = os.path.join(ROOT, "build", "native")


def load(filename: str, what: str, make_target: str = "native",
         use_errno: bool = False) -> ctypes.CDLL:
    path = os.path.join(NATIVE_DIR, filename)
    if not os.path.exists(path):
        raise TracerInternalError(f"{what} is not built ({path} is missing): "
                                  f"run `make {make_target}`")
    return ctypes.CDLL(path, use_errno=use_errno)
