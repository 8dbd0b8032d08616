"""madtrace: a ptrace-based function and data-access tracer for Linux x86-64.

``madtrace.open(DIR)`` opens a trace directory for analysis from Python
(madtrace/api.py, docs/api.md); it is imported on first use, so that
``import madtrace`` stays light for the tracer."""

import os as _os

__version__ = "0.1.0"
# what madtrace.api lends the package, on first use (no __all__: ``from madtrace
# import *`` would shadow the builtin open)
_API = ("open", "Trace")


def __getattr__(name: str):
    if name in _API:
        # by name, not an import statement: a module that imports the package (for
        # __version__) does not depend on the API in import-linter's graph
        import importlib
        value = getattr(importlib.import_module(".api", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))


class _NumpySingleThreaded:
    """numpy's OpenBLAS starts one thread per CPU when it is loaded, and they spin
    a while: on a 2-CPU machine, CPU taken from the target and from the drain of
    the rings (~40 ms of CPU per run).  madtrace does no linear algebra: numpy
    is loaded with one BLAS thread, when something first imports it (commands
    that never need numpy, ``ctl`` and the clients, never load it).  The
    environment is put back as it was, so the target inherits the user's."""

    def find_spec(self, name, path=None, target=None):
        if name != "numpy":
            return None
        import importlib.machinery
        import sys as _sys
        _sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def single_threaded(module):
            saved = _os.environ.get("OPENBLAS_NUM_THREADS")
            _os.environ["OPENBLAS_NUM_THREADS"] = "1"
            try:
                exec_module(module)
            finally:
                if saved is None:
                    del _os.environ["OPENBLAS_NUM_THREADS"]
                else:
                    _os.environ["OPENBLAS_NUM_THREADS"] = saved
        loader.exec_module = single_threaded
        return spec


def _install_numpy_hook() -> None:
    import sys as _sys
    if "numpy" not in _sys.modules:
        _sys.meta_path.insert(0, _NumpySingleThreaded())


_install_numpy_hook()
