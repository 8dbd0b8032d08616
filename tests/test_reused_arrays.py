# SPDX-License-Identifier: GPL-2.0-or-later
"""Arrays whose memory is used again (madtrace/trace/reused_arrays.py): never
while any array or view on it is alive, always after."""

from __future__ import annotations

import gc

import numpy as np

from madtrace.trace.reused_arrays import ReusedArrays


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_memory_is_reused_only_when_no_view_is_left():
    arrays = ReusedArrays()
    first = arrays.empty(1000, np.int64)
    first[:] = 7
    where = address(first)
    view = first[10:20]
    del first
    gc.collect()
    second = arrays.empty(1000, np.int64)      # the view holds the first one's memory
    assert address(second) != where
    second[:] = 9
    assert (view == 7).all()
    del view
    gc.collect()
    third = arrays.empty(900, np.int64)        # now it is free: the smallest that fits
    assert address(third) == where
    del second, third


def test_a_larger_request_gets_new_memory():
    arrays = ReusedArrays()
    small = arrays.empty(10, np.uint8)
    where = address(small)
    del small
    big = arrays.empty(1 << 20, np.uint8)
    assert address(big) != where and len(big) == 1 << 20
    big[:] = 1
    assert big.sum() == 1 << 20
