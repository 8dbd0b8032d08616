# SPDX-License-Identifier: GPL-2.0-or-later
"""Builds madtrace's native parts into one folder, for an installed package:
``setup.py`` (pip install, pip wheel, python -m build, pipx install) calls
``build(out)`` with ``out`` = the wheel's ``madtrace/built``; the layout under it
is the checkout's ``build/`` one (native/, injector/), which the Makefile makes
for a checkout with the same compiler lines; ``client(out)`` compiles madtrace-ctl
for the environment's bin/.

    python3 injector/build_native.py OUT

Missing system libraries are named with the Debian package that has them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CFLAGS = ["-O2", "-g", "-Wall", "-Wextra"]
# header -> (what needs it, the Debian package that has it)
HEADERS = {
    "elfutils/libdw.h": ("the DWARF reader (mtdwarf)", "libdw-dev"),
    "xxhash.h": ("the ring drain", "libxxhash-dev"),
}


class BuildError(Exception):
    pass


def _src(*parts: str) -> str:
    return os.path.join(ROOT, *parts)


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise BuildError(f"building {what} failed: {' '.join(command)}\n{done.stderr.strip()}")


def missing_headers(compiler: str = "gcc") -> list[str]:
    """One line per system header the build needs and the compiler does not find."""
    out = []
    for header, (what, package) in HEADERS.items():
        probe = subprocess.run([compiler, "-E", "-x", "c", "-", "-o", os.devnull],
                               input=f"#include <{header}>\n", capture_output=True, text=True)
        if probe.returncode:
            out.append(f"{header} ({what}): install the Debian package {package}")
    return out


def build(out: str, compiler: str = "gcc", python: str = sys.executable) -> list[str]:
    """Every native part into ``out`` (native/, injector/, bin/); returns the paths made."""
    try:
        subprocess.run([compiler, "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        raise BuildError(f"no C compiler ({compiler}): install the Debian package gcc") from None
    lacking = missing_headers(compiler)
    if lacking:
        raise BuildError("madtrace's native parts need system libraries that are missing:\n  " +
                         "\n  ".join(lacking))
    native, injector = (os.path.join(out, d) for d in ("native", "injector"))
    for d in (native, injector):
        os.makedirs(d, exist_ok=True)
    made = []
    # the injector: templates and patch points from the assembled trampolines
    obj = os.path.join(injector, "trampolines.o")
    _run([compiler, "-c", f"-I{HERE}", "-o", obj, _src("injector", "trampolines.S")], "the injector")
    templates = os.path.join(injector, "templates.json")
    _run([python, _src("injector", "build_templates.py"), obj, _src("injector", "layout.h"),
          templates], "the injector's templates")
    os.unlink(obj)
    made.append(templates)
    # the capture container's constants for the C drain (trace/format.py)
    header = subprocess.run([python, "-c", "from madtrace.trace.capture_file import c_header; "
                             "print(c_header(), end='')"], capture_output=True, text=True,
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                filter(None, [ROOT, os.environ.get("PYTHONPATH")]))))
    if header.returncode:
        raise BuildError(f"generating capture_format.h failed:\n{header.stderr.strip()}")
    with open(os.path.join(native, "capture_format.h"), "w") as f:
        f.write(header.stdout)
    libraries = [
        ("libmtloop.so", [_src("madtrace", "process", "fault_loop.c"),
                          _src("madtrace", "data", "data_expand.c")], [f"-I{HERE}"], []),
        ("libmtdrain.so", [_src("madtrace", "rings", "ring_drain.c"),
                           _src("madtrace", "rings", "drain_thread.c")],
         ["-pthread", f"-I{HERE}", f"-I{native}"], ["-lxxhash"]),
        ("libmtreplay.so", [_src("madtrace", "trace", "replay.c"),
                            _src("madtrace", "trace", "access_pass.c"),
                            _src("madtrace", "trace", "parquet_pages.c"),
                            _src("madtrace", "analysis", "access_counters.c")], [], []),
        ("libmtblocks.so", [_src("madtrace", "data", "heap", "block_index.c")], [], []),
        ("libmtfootprint.so", [_src("madtrace", "analysis", "footprint.c")], [], []),
        ("libmtmemsim.so", [_src("madtrace", "analysis", "memory_sim.c")], [], []),
    ]
    for name, sources, flags, libs in libraries:
        target = os.path.join(native, name)
        _run([compiler, *CFLAGS, "-shared", "-fPIC", *flags, "-o", target, *sources, *libs], name)
        made.append(target)
    reader = os.path.join(native, "mtdwarf")
    _run([compiler, *CFLAGS, "-o", reader, _src("madtrace", "binary", "dwarf_reader.c"),
          "-ldw", "-lelf"], "the DWARF reader")
    made.append(reader)
    return made


def client(out: str, compiler: str = "gcc") -> str:
    """The C client madtrace-ctl in ``out``: installed beside the environment's python
    in its bin/, it finds python and the package from where it is (madtrace_ctl.c)."""
    ctl = os.path.join(out, "madtrace-ctl")
    _run([compiler, *CFLAGS, f'-DMADTRACE_PYTHON_VERSION="{sysconfig.get_python_version()}"',
          "-o", ctl, _src("madtrace", "cli", "madtrace_ctl.c")], "madtrace-ctl")
    return ctl


if __name__ == "__main__":
    try:
        for path in build(sys.argv[1]):
            print(path)
    except BuildError as exc:
        sys.exit(f"madtrace: {exc}")
