# SPDX-License-Identifier: GPL-2.0-or-later
"""Zstandard frames through the system's libzstd (ctypes): the compact access
records' codec (trace/compact.py).

pyarrow has the same codec, but importing it costs ~60-100 ms of CPU and the
GIL, in the middle of a recording's first drain (a whole compute-heavy run
under the hybrid engine lasts ~0.5 s); libzstd.so.1 loads in ~1 ms.  The frames
are standard: either library reads what the other wrote.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

import numpy as np

LEVEL = 1                   # Arrow's default level for ZSTD: what the traces were written with
_lib = None
_scratch = threading.local()


class ZstdError(ValueError):
    pass


def check_available() -> None:
    """ZstdError when the system's libzstd cannot be loaded."""
    _zstd()


def _zstd():
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("zstd") or "libzstd.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            raise ZstdError(f"libzstd is not installed ({exc})") from None
        size_t, p = ctypes.c_size_t, ctypes.c_void_p
        lib.ZSTD_compressBound.restype = size_t
        lib.ZSTD_compressBound.argtypes = [size_t]
        lib.ZSTD_compress.restype = size_t
        lib.ZSTD_compress.argtypes = [p, size_t, p, size_t, ctypes.c_int]
        lib.ZSTD_decompress.restype = size_t
        lib.ZSTD_decompress.argtypes = [p, size_t, p, size_t]
        lib.ZSTD_isError.restype = ctypes.c_uint
        lib.ZSTD_isError.argtypes = [size_t]
        lib.ZSTD_getErrorName.restype = ctypes.c_char_p
        lib.ZSTD_getErrorName.argtypes = [size_t]
        _lib = lib
    return _lib


def _address(data) -> tuple[int, int, object]:
    """(address, length, what keeps it alive) of a bytes-like object, read-only or not."""
    arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else \
        np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    return arr.ctypes.data, arr.nbytes, arr


def _check(lib, n: int) -> int:
    if lib.ZSTD_isError(n):
        raise ZstdError(lib.ZSTD_getErrorName(n).decode())
    return n


def _buffer(size: int) -> np.ndarray:
    """A scratch buffer of at least ``size`` bytes, kept per thread (the drain
    compresses a block of megabytes per batch: a fresh zeroed buffer each time
    cost as much as a copy of it)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < size:
        buf = _scratch.buf = np.empty(max(size, 1 << 16), dtype=np.uint8)
    return buf


def compress(data, level: int = LEVEL) -> bytes:
    lib = _zstd()
    src, n, _keep = _address(data)
    cap = lib.ZSTD_compressBound(n)
    out = _buffer(cap)
    size = _check(lib, lib.ZSTD_compress(out.ctypes.data, cap, src, n, level))
    return out[:size].tobytes()


def decompress(data, size: int) -> bytes:
    """``data`` (one frame) decompressed; its content must be exactly ``size`` bytes."""
    return decompress_array(data, size).tobytes()


def decompress_array(data, size: int) -> np.ndarray:
    """``decompress`` into a new array of bytes of its own (no copy made after it:
    the readers of a trace decompress hundreds of megabytes)."""
    lib = _zstd()
    src, n, _keep = _address(data)
    out = np.empty(size, dtype=np.uint8)
    got = _check(lib, lib.ZSTD_decompress(out.ctypes.data, size, src, n))
    if got != size:
        raise ZstdError(f"the frame holds {got} bytes, not {size}")
    return out
