# SPDX-License-Identifier: GPL-2.0-or-later
"""The DWARF of a target's binaries read while it runs: ``Prefetch`` builds the
DWARF cache's entries that are missing (dwarf_cache.py), each in a reader
process at low priority, so that a first run pays while the target runs, not
after it.  ``python -m madtrace.binary.dwarf_prefetch [--detached] PATH...`` is
that reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from ..cache import disk
from . import dwarf_cache
from .elf import ElfImage


class Prefetch:
    """Builds the entries of ``images`` that are not cached yet, one after the
    other, from a daemon thread: each in another process (``python -m
    madtrace.binary.dwarf_prefetch --detached PATH``, not a child of the tracer) at
    low priority, so that neither the target nor the tracer's own thread waits
    for it.  While an entry is being
    built its key is locked: ``dwarf_of`` of that binary waits for it rather
    than reading it twice.  ``peak_rss`` is the largest child's (bytes)."""

    def __init__(self, images):
        self.images = [i for i in images if i.path is not None and i.has_debug_info]
        self.built = 0
        self.peak_rss = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, name="madtrace-dwarf", daemon=True)
        self._started = threading.Event()

    def start(self) -> "Prefetch":
        self.thread.start()
        self._started.wait()   # every key it will build is locked before anyone asks
        return self

    def _run(self) -> None:
        held = []
        try:
            for image in self.images:
                try:
                    key = disk.cache_key(image)
                except Exception as exc:   # noqa: BLE001 - gone or unreadable: read when needed
                    self.errors.append(f"{image.name}: {exc}")
                    continue
                lock = dwarf_cache.lock_for(key)
                if not dwarf_cache.is_loaded(key) and not os.path.exists(
                        os.path.join(disk.cache_dir(), key + dwarf_cache.SUFFIX)) and \
                        lock.acquire(blocking=False):
                    held.append((image, lock))
        finally:
            self._started.set()
        for image, lock in held:
            try:
                self._build_in_child(image)
            except Exception as exc:   # noqa: BLE001 - reported; dwarf_of reads it when needed
                self.errors.append(f"{image.name}: {exc}")
            finally:
                lock.release()

    def _build_in_child(self, image) -> None:
        # the reader runs in a grandchild (``--detached``: its parent exits at once), so
        # that the tracer's waitpid(-1) never reaps it: it says how it ended on its stdout
        child = subprocess.Popen(["nice", "-n", str(dwarf_cache.NICE), sys.executable, "-m",
                                  "madtrace.binary.dwarf_prefetch", "--detached",
                                  os.path.realpath(image.path)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 env=dict(os.environ, MADTRACE_CACHE_DIR=disk.cache_dir()))
        said = child.stdout.read().decode(errors="replace").strip().splitlines()
        child.stdout.close()
        try:
            child.wait()                 # the intermediate (or already reaped by the tracer)
        except ChildProcessError:
            pass
        try:
            result = json.loads(said[-1]) if said else {}
        except ValueError:
            result = {}
        if not result.get("ok"):
            raise RuntimeError(result.get("error") or "the DWARF reader ended without a word")
        self.peak_rss = max(self.peak_rss, result.get("peak_rss_bytes", 0))
        self.built += 1

    def wait(self) -> None:
        self.thread.join()


def main(args: list[str]) -> int:
    """Builds the entries of PATH... (Prefetch's reader); with --detached in a
    grandchild, and one JSON line on stdout at the end: ok, error, the peak RSS
    of it and its reader."""
    import resource
    detached = bool(args) and args[0] == "--detached"
    if detached:
        args = args[1:]
        if os.fork():
            os._exit(0)
    result: dict = {"ok": True}
    try:
        for path in args:
            image = ElfImage.load(path)
            if image.has_debug_info:
                dwarf_cache.dwarf_of(image)
    except Exception as exc:   # noqa: BLE001 - reported to the tracer, which reads it later
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["peak_rss_bytes"] = 1024 * max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
