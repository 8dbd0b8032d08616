# SPDX-License-Identifier: GPL-2.0-or-later
"""trace/zstd.py (libzstd through ctypes) against pyarrow's zstd: each reads
the other's frames, and damage is an error, never wrong bytes."""

import numpy as np
import pyarrow
import pytest

from madtrace.trace import zstd


@pytest.mark.parametrize("n", [0, 1, 17, 4096, 1 << 20])
def test_frames_are_pyarrows(n):
    data = np.random.default_rng(n).integers(0, 5, n, dtype=np.uint8)
    ours = zstd.compress(data)
    assert pyarrow.decompress(ours, decompressed_size=n, codec="zstd", asbytes=True) == data.tobytes()
    theirs = pyarrow.compress(data, codec="zstd", asbytes=True)
    assert zstd.decompress(memoryview(b"xx" + theirs)[2:], n) == data.tobytes()
    assert zstd.decompress(ours, n) == data.tobytes()


def test_planes_array_and_readonly_input():
    planes = np.arange(64, dtype=np.uint8).reshape(8, 8).T.copy()
    assert zstd.decompress(zstd.compress(planes), 64) == planes.tobytes()
    ro = np.frombuffer(bytes(range(200)), dtype=np.uint8)
    assert not ro.flags.writeable
    assert zstd.decompress(zstd.compress(ro), 200) == bytes(range(200))


def test_damage_is_an_error():
    frame = zstd.compress(bytes(range(256)) * 64)
    with pytest.raises(zstd.ZstdError):
        zstd.decompress(b"not a zstd frame", 100)
    with pytest.raises(zstd.ZstdError):
        zstd.decompress(frame[:len(frame) // 2], 256 * 64)
    with pytest.raises(zstd.ZstdError):
        zstd.decompress(frame, 256 * 64 + 1)       # the frame holds fewer bytes
