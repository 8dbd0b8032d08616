# SPDX-License-Identifier: GPL-2.0-or-later
"""A recording across the images of its process: exec, dlopen, pending -f patterns,
and the address space of each (attach: loaded, and -f's functions scanned, before
the target is stopped).

* exec: what the old image recorded is drained and written to its directory
  (outcome "exec"); the new image gets a whole trace directory, DIR/exec.N,
  and is traced as if it had been launched directly: engines installed at its
  entry point (process/entry_start.py), when the loader has mapped its
  libraries.  DIR/meta.json lists every image (``images``) and ends with the
  process's own end (``process_exit_status``).
* -f patterns that match no function yet are pending (as gdb's pending
  breakpoints): resolved in each new image and at each dlopen
  (target/loader_watch.py), before the new module runs; those that never
  match are reported at the end (``unmatched_functions``).

``ImageChanges`` is a part of ``recording.Recording`` (a mixin): it uses the
recording's engines, options, output and hooks.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from ..binary.address_space import AddressSpace
from ..binary.maps import image_mappings, read_maps
from ..errors import MadtraceError
from ..calls.ahead import decode_ahead
from ..calls.entry_links import EntryLinks
from ..target.loader_watch import LoaderWatch
from ..calls.plan import prepare_plan, split_patterns
from ..calls.staging import stage
from ..calls.thread_pool import prepare as prepare_thread_pool
from ..process.memory import ProcessMemory
from ..process.entry_start import EntryStart
from ..process.tracee import Tracee
from ..trace import store
from ..trace.format import MAPS_START_FILE, exec_dir
from ..trace.meta import read_meta, write_meta


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def read_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def image_entry(directory: str, meta: dict) -> dict:
    """One image of the process in DIR/meta.json's ``images``."""
    accesses = meta.get("accesses") or {}
    return {"dir": directory, "command": meta.get("command"), "outcome": meta.get("outcome"),
            "calls": sum((meta.get("calls") or {}).values()),
            "accesses": sum(c.get("L", 0) + c.get("S", 0) for c in accesses.values())}



class ImageChanges:
    def _on_exec(self, tracee: Tracee) -> None:
        """The process exec'd: what the old image recorded goes to its directory; the
        new image is traced in DIR/exec.N as if it had been launched directly, from
        its entry point (its libraries mapped by then)."""
        command = read_cmdline(tracee.pid)
        number = len(self.images) + 1
        image = exec_dir(self.trace_root, number)
        where = "by the flight recorder, whose window is now the new image's" \
            if self.flight is not None else f"in {image}"
        self.log(f"the target called exec ({' '.join(command)[:80]}): its new image is traced "
                 f"{where}")
        self._end_image(os.path.basename(image), command)
        self.output = image
        store.create_trace_dir(self.output, force=False)
        if self.flight is not None:
            self.flight.recorder.follow(image)
        self.meta = {"mode": "exec", "command": command, "image": number}
        self._maps_end = ""
        self._load_address_space()
        if self._entry_start is None:
            self._entry_start = EntryStart(tracee, lambda tid: self._start_exec_image())
            self.hooks.syscall_claimers.append(self._entry_start.claim)
        if not self._entry_start.arm(tracee.pid):
            # a static executable: tracing starts once it has its thread pointer
            self._entry_start.arm_static(tracee.pid)

    def _end_image(self, next_image: str, next_command: list[str]) -> None:
        """The image traced until now was replaced by exec: drain and write its trace."""
        if self._entry_start is not None:
            self._entry_start.forget()          # the old image's stub went with it
        if self._loader_watch is not None:
            self._loader_watch.patches.applied.clear()   # its patch went with the image too
            self._loader_watch = None
        if self.data is not None and self.data.active:
            self.data.forget_after_exec()
        if self.functions is not None and self.functions.active:
            self.functions.forget_after_exec()
        self._unpin()
        for hooks, hook in self._image_hooks:
            if hook in hooks:
                hooks.remove(hook)
        self._image_hooks.clear()
        self.meta.update(self._state_meta("exec"), next_image=next_image, next_command=next_command)
        self.meta.update(self._function_results(final=True))
        self.meta.update(self._data_results())
        write_meta(self.output, self.meta)
        self._finish_store()
        self.images.append(image_entry(os.path.relpath(self.output, self.trace_root) or ".",
                                       self.meta))
        self.functions = None
        self.data = None
        self.entry_links = EntryLinks()

    def _watch_loader(self) -> None:
        """Pending -f patterns: learn of each dlopen as it happens (loader_watch.py)."""
        watch = LoaderWatch(self.tracee, self.address_space, self._modules_changed)
        if not watch.install():
            self.log(f"pending -f patterns are resolved at exec only: {watch.reason}")
            return
        self._loader_watch = watch
        self._image_hook(self.hooks.signal_claimers, watch.claim)
        self._image_hook(self.hooks.before_detach, lambda tracee: watch.remove())

    def _modules_changed(self, tid: int) -> None:
        """The loader mapped or unmapped modules (dlopen, dlclose): resolve the
        pending -f patterns that a new module defines, before it runs any code."""
        events, others = self.tracee.hold_all()   # threads made meanwhile included
        self.controller.deferred.extend(events)
        try:
            before = {m.path: m for m in self.address_space.modules}
            self._load_address_space()
            after = {m.path for m in self.address_space.modules}
            for path, module in before.items():
                if path not in after and self.functions is not None:
                    self.functions.forget_range(module.start, module.end)   # dlclose
            matched, self.pending_functions = split_patterns(self.address_space, self.pending_functions)
            if matched:
                self.matched_functions.update(matched)
                self.log(f"-f {', '.join(map(repr, matched))}: defined by a module just loaded")
                if self.functions is not None and self.functions.plan is not None:
                    self.functions.space = self.address_space
                    self.functions.add(matched)
                else:
                    self._install_function_tracing(matched)
        finally:
            deferred = {e.tid for e in self.controller.deferred}
            for other in others:
                state = self.tracee.threads.get(other)
                if other != tid and state is not None and not state.running and other not in deferred:
                    self.tracee.resume(other)

    def _start_exec_image(self) -> None:
        """At the entry point of an exec'd image: its libraries are mapped now."""
        self._load_address_space()
        self._start_image()

    def _write_images_index(self) -> None:
        """DIR/meta.json (the first image's) lists every image of the process and
        ends with the process's own end."""
        images = self.images + [image_entry(os.path.relpath(self.output, self.trace_root),
                                            self.meta)]
        first = read_meta(self.trace_root)
        first.update(images=images, process_exit_status=self.meta.get("exit_status"),
                     process_outcome=self.meta.get("outcome"))
        write_meta(self.trace_root, first)

    def _write_start_files(self) -> None:
        """maps.start.txt, meta.json ("running"), and the store writer's thread;
        attached, once the target runs again (meta.json's module counts took 2-4
        ms of its pause, the writer's thread 4-8 ms on a busy VM)."""
        maps = self._program_maps()
        self.meta["pid"] = self.tracee.pid
        self.meta["start_time"] = time.time()

        def write(maps=maps):
            store.write_text(self.output, MAPS_START_FILE, maps)
            # replaced at the end; if madtrace is killed first, readers see a partial trace
            write_meta(self.output, dict(self.meta, **self._state_meta("running"),
                                         tracer_pid=os.getpid()))
        if self.tracee.launched or self.controller.running:
            write()
        else:
            self.controller.after_resume.append(write)

    def _space_ahead(self, pid: int) -> tuple | None:
        """Attach: the address space loaded before the target is stopped (parsing its
        ELF files was most of an attach's pause: 130-150 ms of the 140-160 ms
        http.server stood still).  (the mappings it was made of, the space), or
        None where it cannot be read yet."""
        started = time.perf_counter()
        try:
            maps = read_maps(pid)
            with ProcessMemory(pid) as mem:
                space = AddressSpace.from_maps(maps, mem.read, pid=pid,
                                               exe_path=os.readlink(f"/proc/{pid}/exe"))
                self.symbols_seconds += time.perf_counter() - started
                if self.options.trace_functions and self.options.functions:
                    try:   # -f: what the plan needs from the files, done while the target runs
                        patterns = split_patterns(space, self.options.functions)[0]
                        prepare_plan(space, patterns)
                        prepare_thread_pool(space)      # a live session's ring pool (attached)
                        # the prologues to relocate, decoded (calls/ahead.py)
                        decode_ahead(SimpleNamespace(mem=mem), space, patterns,
                                     self.options.method, pool=True)
                    except MadtraceError:
                        pass   # said when the functions are installed
        except (MadtraceError, OSError):
            return None
        return image_mappings(maps), space

    def prepare_functions(self, patterns: list[str], stop_for=None) -> None:
        """While the target runs: what ``add_functions`` can do ahead (plan.py, and
        for the ring pool of a live session: thread_pool.py); with ``stop_for`` (a
        live session's brief stop), all but the patching (calls/staging.py)."""
        prepare_plan(self.address_space, patterns)
        if self.defer_while_stopped and not self.tracee.launched:
            prepare_thread_pool(self.address_space)
            first = self.functions is None or self.functions.plan is None
            if first and self._engine_ahead is None:    # its set-up is not the target's pause
                self._engine_ahead = self._new_engine(self.tracee, self.address_space)
            decode_ahead(self.tracee, self.address_space, patterns, self.options.method, pool=first)
            if stop_for is not None and self.data is None:
                engine = self._engine_ahead if first else self.functions
                engine.tracee, engine.defer_tables = self.tracee, True
                try:
                    stage(engine, patterns, stop_for, pool=not self.options.follow_forks)
                except BaseException:
                    if first:        # a fresh engine next time (its areas go at detach)
                        self._engine_ahead = None
                    raise

    def _load_address_space(self, ahead: tuple | None = None) -> None:
        """``ahead``: see ``_space_ahead``; kept if the target mapped no file since."""
        pid = self.tracee.pid
        started = time.perf_counter()
        maps = read_maps(pid)
        if ahead is not None and ahead[0] == image_mappings(maps):
            self.address_space = ahead[1]
            return
        self.address_space = AddressSpace.from_maps(
            maps, self.tracee.mem.read, exe_path=os.readlink(f"/proc/{pid}/exe"), pid=pid)
        self.symbols_seconds += time.perf_counter() - started
