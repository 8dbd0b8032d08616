# SPDX-License-Identifier: GPL-2.0-or-later
"""The native parts of madtrace: the C libraries loaded with ctypes (the data
engine's fault loop, process/fault_loop.c; the ring drain, rings/ring_drain.c; the
call replay, trace/replay.c; the block index, data/heap/block_index.c; the
footprint core, analysis/footprint.c), the DWARF reader ``mtdwarf`` and the
injector's templates.

An installed madtrace (pip, pipx: setup.py builds them) holds them in its package,
``madtrace/built/``; a checkout has them in ``build/`` (``make``).  ``built(...)``
says where one is; ``load`` opens a library and says how to get it when it is
missing.  Each user declares the signatures it calls."""

from __future__ import annotations

import ctypes
import os

from .errors import TracerInternalError

PACKAGE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(PACKAGE)
INSTALLED = os.path.join(PACKAGE, "built")        # what setup.py builds into a wheel
CHECKOUT = os.path.join(ROOT, "build")            # what the Makefile builds


def built(*parts: str) -> str:
    """Where a native part is: the installed package's, else the checkout's build/."""
    return os.path.join(INSTALLED if os.path.isdir(INSTALLED) else CHECKOUT, *parts)


def how_to_build(make_target: str) -> str:
    if os.path.isdir(INSTALLED):
        return "reinstall madtrace (pip install --force-reinstall madtrace): a part of it is missing"
    return f"run `make {make_target}`"


NATIVE_DIR = built("native")


def load(filename: str, what: str, make_target: str = "native",
         use_errno: bool = False) -> ctypes.CDLL:
    path = os.path.join(NATIVE_DIR, filename)
    if not os.path.exists(path):
        raise TracerInternalError(f"{what} is not built ({path} is missing): "
                                  f"{how_to_build(make_target)}")
    return ctypes.CDLL(path, use_errno=use_errno)
