"""madtrace: a ptrace-based function and data-access tracer for Linux x86-64."""

import os as _os

__version__ = "0.1.0"


def _load_numpy_single_threaded() -> None:
    """numpy's OpenBLAS starts one thread per CPU when it is loaded, and they spin
    a while: on a 2-CPU machine, CPU taken from the target and from the drain of
    the rings (~40 ms of CPU per run).  madtrace does no linear algebra: numpy
    is loaded with one BLAS thread.  The environment is put back as it was, so
    the target inherits the user's."""
    saved = _os.environ.get("OPENBLAS_NUM_THREADS")
    _os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        if saved is None:
            del _os.environ["OPENBLAS_NUM_THREADS"]
        else:
            _os.environ["OPENBLAS_NUM_THREADS"] = saved


_load_numpy_single_threaded()
