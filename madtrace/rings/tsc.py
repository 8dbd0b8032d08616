"""The time-stamp counter as the trampolines read it, and its frequency.

The trampolines store raw ``rdtsc`` values; a report turns them into
nanoseconds with the frequency measured here, in the tracer, against the
monotonic clock (the TSC is constant and shared by all CPUs on machines with
the ``constant_tsc`` and ``nonstop_tsc`` flags, which madtrace records)."""

from __future__ import annotations

import ctypes
import mmap
import time

# rdtsc; shl rdx, 32; or rax, rdx; ret
_RDTSC_CODE = bytes.fromhex("0f3148c1e2204809d0c3")
_rdtsc = None


def rdtsc() -> int:
    global _rdtsc
    if _rdtsc is None:
        buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        buf.write(_RDTSC_CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        _rdtsc = (ctypes.CFUNCTYPE(ctypes.c_uint64)(address), buf)
    return _rdtsc[0]()


# (perf_counter_ns, rdtsc) taken by ``start_calibration``: the measure's start
_origin: tuple[int, int] | None = None


def start_calibration() -> None:
    """Starts measuring the TSC's frequency now (a recording's start, the resident
    process's): ``tsc_hz`` then waits only for what is left of its window,
    not for a whole window while the target is stopped."""
    global _origin
    if _origin is None:
        _origin = (time.perf_counter_ns(), rdtsc())


def tsc_hz(window: float = 0.02) -> float:
    """TSC ticks per second, measured over ``window`` seconds at least (since
    ``start_calibration`` if it was called)."""
    start_calibration()
    assert _origin is not None
    t0, c0 = _origin
    left = window - (time.perf_counter_ns() - t0) / 1e9
    if left > 0:
        time.sleep(left)
    t1, c1 = time.perf_counter_ns(), rdtsc()
    return (c1 - c0) * 1e9 / (t1 - t0)


def tsc_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return [x for x in line.split() if x in ("constant_tsc", "nonstop_tsc", "tsc_reliable")]
    except OSError:
        pass
    return []
