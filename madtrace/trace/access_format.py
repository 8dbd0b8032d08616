# SPDX-License-Identifier: GPL-2.0-or-later
"""The access rows of a trace, as the readers give them (data/<tid>.acc of the
fault engine, data/<tid>.dat of the hybrid engine decoded by compact.py):

``ACCESS_DTYPE``, 48 bytes: ``seq`` (how many call records the thread had
written: the access lies between record seq-1 and record seq), ``order`` (the
tracer's event counter, shared with allocation events: a total order of what
the tracer saw), ``rip`` (the accessing instruction's original address),
``addr``, ``block`` (heap block id, 0: none), ``size``, ``kind`` (1 load,
2 store), ``freed`` (the block was already freed), ``ilen`` (instruction
length), ``first`` (the first access of one execution of the instruction)."""

from __future__ import annotations

import numpy as np

ACCESS_DTYPE = np.dtype([("seq", "<u8"), ("order", "<u8"), ("rip", "<u8"), ("addr", "<u8"),
                         ("block", "<u4"), ("size", "<u2"), ("kind", "u1"), ("freed", "u1"),
                         ("ilen", "u1"), ("first", "u1"), ("pad", "u1", 6)])
ACCESS_FIELDS = ("seq", "order", "rip", "addr", "block", "size", "kind", "freed", "ilen", "first")
KIND_LOAD, KIND_STORE = 1, 2
