"""Function tracing in a live target: inject, patch, follow threads, restore.

``FunctionTracer.install`` (all threads stopped):
 1. plans the functions (``plan``), 2. maps the control area of the rings and
 one code area per patched module within rel32 reach (``areas``), 3. registers
 every thread's ring (ring blocks are mapped a chunk at a time, as threads
 need them), 4. writes the trampolines through the tracer's mapping of the
 code areas, 5. applies the 5-byte patches (``patchset``), 6. starts the
 drain thread.  ``restore`` un-patches live; trampolines and rings stay
 mapped, because a frame may still return into them.  ``detach`` restores
 everything and stops recording; the process's MadtraceAreas (mappings.py)
 then takes the areas out, with the return addresses of pending calls
 (``return_points`` of the code areas, ``_pending_returns``).  A live, attached
 session does 1-2 in a brief stop and 4 while the target runs (``staging``).
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from ..arch.x86_64.encode import jmp_rel32
from ..arch.x86_64.relocate import relocate_entry
from ..binary.address_space import AddressSpace
from ..rings.rings import MADV_POPULATE_WRITE, RingSet
from ..rings.tsc import start_calibration, tsc_flags, tsc_hz
from ..process.remote_syscall import RemoteSyscalls
from ..errors import NoSuchProcessError
from ..process.tracee import Tracee
from ..trace.format import FUNCTIONS_FILE, RECORD_FORMAT
from ..target.areas import CodeArea, SharedArea, gap_for_module, page_round
from .entry_links import EntryLinks
from ..rings.child_rings import private_rings, shadow_entries
from ..target.mappings import MadtraceAreas
from . import staging
from ..target.patchset import Patch, PatchConflict, PatchSet, step_out_of
from .plan import Plan, Site, TracedFunction, make_plan
from ..target.templates import load_injector
from ..target.areas import REL32_REACH
from .thread_pool import ThreadPool, owner_offset, owner_word, place_thread_code
from ..target.trampoline_unwind import eh_frame
from ..target.unwind_registry import Unwinder, UnwindObjects
from ..rings.writer_windows import TRAMPOLINES, WriterWindows

GROUP = "madtrace-functions"     # the areas of function tracing stay or go together
ENTRY_SLOT = 6 + 7 + 8           # an entry trampoline's jmp [slot], padding, the slot
start_calibration()     # the TSC's frequency is measured from here on, not while a target waits


class FunctionTracer:
    def __init__(self, tracee: Tracee, space: AddressSpace, out_dir: str, timestamps: bool = True,
                 method: str = "auto", links: EntryLinks | None = None):
        """``links``: shared with the data engine of the same image (entry_links.py)."""
        self.method = method
        self.tracee = tracee
        self.space = space
        self.out_dir = out_dir
        self.timestamps = timestamps
        self.injector = load_injector()
        self.writer_windows = WriterWindows.of(self.injector, TRAMPOLINES)   # signals
        self.plan: Plan | None = None
        self.rings: RingSet | None = None
        self.code_areas: dict[str, CodeArea] = {}
        self.retired_code_areas: list[CodeArea] = []   # full areas replaced by ``add``
        self.patches = PatchSet()
        self.patches_of: dict[int, list[int]] = {}   # function id -> patch addresses
        # where each entry trampoline goes after its entry record (entry_links.py)
        self.links = links if links is not None else EntryLinks()
        self._new_slots: list[tuple[int, SharedArea, int, tuple]] = []
        self._new_returns: list[tuple[int, SharedArea, int]] = []
        self.report: dict = {"patched": [], "skipped": [], "inexact": []}
        self.active = False
        # (pc_begin, pc_end, return_to) of call-site trampolines in modules with C++
        # exceptions, registered with the target's unwinder after patching
        self.unwind_pending: list[tuple[int, int, int]] = []
        self.unwinder = Unwinder(space)
        self.unwind = UnwindObjects(self.unwinder, self.injector, GROUP)
        # (address in a trampoline, original address, size) of each relocated
        # prologue instruction: its accesses are named by the original
        self.moved_code: list[tuple[int, int, int]] = []
        self._moved_arrays = None
        self.exit_stubs: set[int] = set()            # where entry-patched calls return
        # functions.json is written by flush_tables (after the target resumes) when set
        self.defer_tables = False
        self._tables_dirty = False
        self._tsc_hz: float | None = None
        self._start_pending = False        # the drain thread waits for after_stop
        self.threads = ThreadPool(self)      # live sessions: new threads take pool rings
        self.thread_code: CodeArea | None = None     # mt_claim, mt_seizeme (and the hooks)
        self.staged: staging.Staged | None = None    # built ahead for install/add (staging.py)

    # --------------------------------------------------------------- install
    def install(self, patterns: list[str]) -> dict:
        """Every thread stopped: plan, areas and patches (``stage`` did the first two
        and the trampolines ahead if it was given the same patterns)."""
        staged = staging.take(self, patterns)
        if staged is None:
            self.map_areas(patterns)
        built = staged.built if staged is not None else {}
        tracee, plan = self.tracee, self.plan
        # attached, the target waits: the rings' pages are allocated once it runs again
        # (after_stop), and each is mapped at its first touch (launched: before it runs)
        self.rings.defer_populate = not tracee.launched
        try:
            for tid in list(tracee.threads):
                self.register_thread(tid)
        finally:
            self.rings.defer_populate = False
        if tracee.launched:
            self._map_rings(tracee)
        rips = [tracee.get_regs(tid).rip for tid in tracee.threads]
        for fn in plan.functions:
            self._patch_function(fn, rips, built.get(fn.fid))
        self._register_unwind()
        self.rings.set_enabled(True)
        if tracee.launched:
            self.rings.start()
        else:       # the drain thread starts once the target runs again (after_stop)
            self._start_pending = True
        self.active = True
        self._write_tables()
        return self.report

    def map_areas(self, patterns: list[str], pool: bool = False, plan: Plan | None = None) -> None:
        """Every thread stopped: the plan, and what it needs mapped in the target
        (the remote system calls of an install): the control block, a code area
        per module, the rings of the threads there are; ``pool``: the ring pool's
        rings and the C library's code area too; ``plan``: made ahead (no IFUNC)."""
        self.links.watch(self.patches)
        tracee = self.tracee
        with RemoteSyscalls(tracee) as rs:
            plan = self.plan = plan or self.make_plan(rs, patterns)
            self.report["skipped"] = [{"what": w, "why": y} for w, y in plan.skipped]
            control = SharedArea(rs, RingSet.size_for(self.injector), "madtrace-rings",
                                 executable=False, group=GROUP)
            self.rings = RingSet(control, self.injector, self.out_dir, map_chunk=self._map_chunk)
            self.rings.reserve_sites(len(plan.sites))
            self.rings.owner_offset = owner_offset(tracee)
            for module in {fn.module.name: fn.module for fn in plan.functions}.values():
                fns = [fn for fn in plan.functions if fn.module is module]
                self._new_code_area(rs, module, self.code_size(plan, fns))
            self.thread_code = place_thread_code(rs, self.rings, self.injector, GROUP,
                                                 list(self.code_areas.values()))
        MadtraceAreas.of(tracee).return_sources.append(self._pending_returns)
        self.rings.ensure_free(len(tracee.threads))
        if pool:
            self.threads.map_ahead()

    def add(self, patterns: list[str]) -> dict:
        """Instrument more functions while tracing (every thread stopped). Functions
        already patched stay as they are; restored ones are patched again (their
        counts go on). Returns the report of this addition alone."""
        if self.plan is None or self.rings is None:
            return self.install(patterns)
        staged = staging.take(self, patterns) or self.plan_more(patterns)
        rips = [self.tracee.get_regs(tid).rip for tid in self.tracee.threads]
        for fn in staged.functions:
            self._patch_function(fn, rips, staged.built.get(fn.fid))
        self._register_unwind()
        self._write_tables()
        return {key: self.report[key][start:] for key, start in staged.report_from.items()}

    def plan_more(self, patterns: list[str], stop_for=None) -> "staging.Staged":
        """The functions ``add`` patches, planned and merged into the plan, with the
        code areas they need.  Without ``stop_for`` every thread is stopped; with
        it (``stage``: the target runs) the remote system calls, if any (an IFUNC
        to resolve, a code area to map), go through ``stop_for(work)``."""
        staged = staging.Staged(patterns)

        def work(rs):
            fresh = self.make_plan(rs, patterns)
            chosen = self._merge_plan(fresh)
            self.rings.reserve_sites(len(self.plan.sites))
            staged.report_from = {key: len(self.report[key]) for key in staging.REPORT_KEYS}
            self.report["skipped"] += [{"what": w, "why": y} for w, y in fresh.skipped]
            for module in {fn.module.name: fn.module for fn in chosen}.values():
                need = self.code_size(self.plan, [fn for fn in chosen if fn.module is module])
                area = self.code_areas.get(module.name)
                if area is not None and area.cursor + need + 16 <= area.area.end:
                    continue
                if area is not None:
                    self.retired_code_areas.append(area)   # its trampolines stay in use
                self._new_code_area(rs, module, need)
            staged.functions = chosen

        if stop_for is not None and not staging.needs_target(self, patterns):
            work(None)
        else:
            def stopped():
                with RemoteSyscalls(self.tracee) as rs:
                    work(rs)
            (stop_for or (lambda run: run()))(stopped)
        return staged

    def _map_chunk(self, size: int) -> SharedArea:
        """Ring blocks for more threads (a stopped thread runs the system calls)."""
        with RemoteSyscalls(self.tracee) as rs:
            return SharedArea(rs, size, "madtrace-rings", executable=False, group=GROUP)

    def _pending_returns(self) -> list:
        """(stack slot, exit stubs, real return address) of every call of an
        entry-patched function that has not returned (mappings.py)."""
        if self.rings is None or self.rings.closed:
            return []
        fs_bases = {}
        for tid, state in list(self.tracee.threads.items()):
            if not state.running and not state.gone:
                try:
                    fs_bases[tid] = self.tracee.get_regs(tid).fs_base
                except NoSuchProcessError:
                    continue
        return [(slot, self.exit_stubs, ret) for ret, slot in shadow_entries(self.rings, fs_bases)]

    def _map_rings(self, tracee: Tracee) -> None:
        """Maps the rings of the threads there are (their pages exist already, see
        RingSet._populate) into the target's page tables, so that writing the
        first records takes no page fault (best effort: one madvise each)."""
        with RemoteSyscalls(tracee) as rs:
            for tid in self.rings.thread_ring:
                address, size = self.rings.records_range(tid)
                rs.call("madvise", address, size, MADV_POPULATE_WRITE, check=False)

    def make_plan(self, rs: RemoteSyscalls | None, patterns: list[str]) -> Plan:
        """``rs`` None: no IFUNC to resolve (staging.needs_target)."""
        return make_plan(self.space, patterns, method=self.method,
                         resolve_ifunc=rs and (lambda ms: rs.call_function(ms.address)),
                         cxx_unwind=self._register_frame_info() is not None)

    def _register_frame_info(self) -> int | None:
        """The address of __register_frame_info in the target's unwinder, if loaded
        (unwind_registry.py)."""
        return self.unwinder.registrar()

    def _register_unwind(self) -> None:
        """Registers the pending call-site trampolines with the target's unwinder
        (unwind.py): one .eh_frame object (unwind_registry.py), taken back from
        the unwinder when the session ends, before the trampolines go."""
        if not self.unwind_pending:
            return
        blob = eh_frame(self.unwind_pending)
        with RemoteSyscalls(self.tracee) as rs:
            self.unwind.register(rs, lambda at: blob, len(blob))
        self.unwind_pending = []

    def code_area_for(self, module, need: int) -> CodeArea:
        """A code area within rel32 reach of ``module`` with room for ``need`` more
        bytes (another module's, if it reaches: no new mapping); every thread
        stopped."""
        area = self.code_areas.get(module.name)
        if area is None:
            for other in self.code_areas.values():
                if other.cursor + need + 16 <= other.area.end and \
                        max(other.area.end - module.start, module.end - other.area.address) < REL32_REACH:
                    return other
        if area is None or area.cursor + need + 16 > area.area.end:
            if area is not None:
                self.retired_code_areas.append(area)   # its trampolines stay in use
            with RemoteSyscalls(self.tracee) as rs:
                self._new_code_area(rs, module, need)
        return self.code_areas[module.name]

    def _new_code_area(self, rs: RemoteSyscalls, module, need: int) -> None:
        """A code area for ``need`` bytes of trampolines (and room to grow), within
        rel32 reach of ``module``."""
        size = page_round(need + 65536)
        address = gap_for_module(self.tracee.pid, module.start, module.end, size)
        area = SharedArea(rs, size, f"madtrace-code-{module.name}", executable=True,
                          address=address, group=GROUP)
        area.steppable = True
        self.code_areas[module.name] = CodeArea(area)
        self.writer_windows.watch(area, self.tracee)

    def _merge_plan(self, fresh: Plan) -> list[TracedFunction]:
        """Appends the functions of ``fresh`` that are new to ``self.plan`` (with new
        function and site ids); returns those to patch, including known functions
        that were restored."""
        plan = self.plan
        known = {fn.address: fn for fn in plan.functions}
        names = {fn.name for fn in plan.functions}
        chosen = []
        for fn in fresh.functions:
            old = known.get(fn.address)
            if old is not None:
                if old.fid not in self.patches_of and old.method != "skipped":
                    self.report["patched"] = [p for p in self.report["patched"]
                                              if (p["function"], p["module"]) != (old.name, old.module.name)]
                    chosen.append(old)
                continue
            if fn.name in names:
                fn.name = f"{fn.module.name}:{fn.name.split(':')[-1]}"
            sites = [fresh.sites[sid] for sid in fn.site_ids]
            fn.fid, fn.site_ids = len(plan.functions), []
            plan.functions.append(fn)
            for site in sites:
                site.sid = len(plan.sites)
                plan.sites.append(site)
                fn.site_ids.append(site.sid)
            names.add(fn.name)
            chosen.append(fn)
        for name, scan in fresh.scans.items():
            plan.scans.setdefault(name, scan)
        plan.skipped += fresh.skipped
        return chosen

    def code_size(self, plan: Plan, fns: list[TracedFunction]) -> int:
        total = 0
        for fn in fns:
            for sid in fn.site_ids:
                kind = plan.sites[sid].kind
                if kind == "entry":
                    total += (self.injector.template("entry", self.timestamps).size
                              + self.injector.template("exitstub", self.timestamps).size + 96
                              + ENTRY_SLOT)
                else:
                    total += self.injector.template("callsite" if kind == "call" else "tailsite",
                                                    self.timestamps).size + 16
        return total

    def build(self, fn: TracedFunction):
        """The trampolines of ``fn``'s sites, written into its code area: (its
        patches, entry slots, return slots) to apply, or why it cannot be patched
        (an exception).  Nothing in the target runs them before the patches are
        applied, so this may run while the target runs (``stage``)."""
        area = self.code_areas[fn.module.name]
        self._new_slots, self._new_returns = [], []
        try:
            patches = [self._build_site(self.plan.sites[sid], area) for sid in fn.site_ids]
        except (PatchConflict, _Refused) as exc:
            return exc
        return patches, self._new_slots, self._new_returns

    def _patch_function(self, fn: TracedFunction, rips: list[int], built=None) -> None:
        """Every thread stopped: ``fn``'s patches applied (``built``: its trampolines,
        built ahead; the patches check that the code is still what they replace)."""
        built = self.build(fn) if built is None else built
        try:
            if isinstance(built, Exception):
                raise built
            patches, new_slots, new_returns = built
            rips = step_out_of(self.tracee, patches, rips)
            self.patches.apply(self.tracee.mem, patches, rips)
        except (PatchConflict, _Refused) as exc:
            self.report["skipped"].append({"what": fn.name, "why": str(exc)})
            fn.method = "skipped"
            return
        for start, slot_area, slot, moved in new_slots:
            self.links.add(start, slot_area, slot, moved)
        for back, slot_area, slot in new_returns:
            self.links.add_return(back, slot_area, slot)
        self.links.applied(patches)         # the sites in the data engine's copies too
        self.patches_of[fn.fid] = [p.address for p in patches]
        entry = {"function": fn.name, "module": fn.module.name, "method": fn.method,
                 "reason": fn.reason, "sites": len(patches)}
        self.report["patched"].append(entry)
        if fn.inexact:
            self.report["inexact"].append({"what": fn.name, "why": fn.inexact})

    def _build_site(self, site: Site, area: CodeArea) -> Patch:
        ts = self.timestamps
        ctl = self.rings.control_address
        owner = self.rings.owner_offset
        mem = self.tracee.mem
        if site.kind in ("call", "tail"):
            if self.patches.covering(site.address, site.address + 5):   # (plan.py early_site)
                raise _Refused(f"its call site at {site.address:#x} lies in bytes patched already")
            original = mem.read(site.address, 5)
            target = site.address + 5 + struct.unpack("<i", original[1:])[0]
            tpl = self.injector.template("callsite" if site.kind == "call" else "tailsite", ts)
            at = area.allocate(tpl.size)
            fields = dict(ctl_entry=ctl, code_entry=site.sid << 1, target=target,
                          count_entry=self.rings.counter_offset(site.sid), owner_entry=owner)
            if site.kind == "call":
                fields.update(ctl_exit=ctl, code_exit=(site.sid << 1) | 1, resume=site.address + 5,
                              owner_exit=owner,
                              **{"return": site.address + 5})
                (call_field, _), = tpl.patch_points["target"]   # the re-issued call's rel32
                area.area.return_points[at + call_field + 4] = site.address + 5
                (slot, _), = tpl.patch_points["resume"]         # where it goes on (entry_links.py)
                self._new_returns.append((site.address + 5, area.area, at + slot))
                if self.plan.scans[site.function.module.name].cxx:
                    self.unwind_pending.append((at + call_field - 1, at + call_field + 4,
                                                site.address + 5))
            area.area.write(at, bytes(tpl.instantiate(at, **fields)))
            return Patch(site.address, original, jmp_rel32(site.address, at),
                         f"{site.kind} site of {site.function.name} at {site.address:#x}")
        # function entry: the template, jmp [slot], the slot, the relocated first
        # instructions, jmp back into the body (entry_links.py)
        fn = site.function
        self.links.before_patching(fn.address)     # the data engine's own entry jump out
        code = mem.read(fn.address, fn.size)
        entry_tpl = self.injector.template("entry", ts)
        exit_tpl = self.injector.template("exitstub", ts)
        exit_at = area.allocate(exit_tpl.size)
        self.exit_stubs.add(exit_at)
        entry_at = area.allocate(entry_tpl.size + ENTRY_SLOT + 64 + 5)
        jump_at = entry_at + entry_tpl.size
        slot = (jump_at + 6 + 7) & ~7
        relocated_at = slot + 8
        scan, bias = self.plan.scans[fn.module.name].scan, fn.module.bias
        reloc = relocate_entry(code, fn.address, fn.size, relocated_at,
                               branches_into=lambda lo, hi: scan.branches_into(lo - bias, hi - bias))
        if not reloc:
            raise _Refused(f"entry of {fn.name} cannot be relocated: {reloc.reason}")
        if self.patches.covering(fn.address, fn.address + reloc.consumed):
            raise _Refused(f"entry of {fn.name}: its first bytes hold a patched call site")
        area.area.write(exit_at, bytes(exit_tpl.instantiate(
            exit_at, ctl_exit=ctl, code_exit=(site.sid << 1) | 1, owner_exit=owner)))
        body = bytes(entry_tpl.instantiate(entry_at, ctl_entry=ctl, code_entry=site.sid << 1,
                                           count_entry=self.rings.counter_offset(site.sid),
                                           exitstub=exit_at, owner_entry=owner))
        body += b"\xff\x25" + struct.pack("<i", slot - jump_at - 6) + \
            b"\xcc" * (slot - jump_at - 6) + struct.pack("<Q", relocated_at) + reloc.code
        body += jmp_rel32(entry_at + len(body), fn.address + reloc.consumed)
        area.area.write(entry_at, body)
        self._new_slots.append((fn.address, area.area, slot, reloc.moved))
        self.moved_code.extend(reloc.moved)
        self._moved_arrays = None
        patched = jmp_rel32(fn.address, entry_at) + b"\xcc" * (reloc.consumed - 5)
        return Patch(fn.address, code[:reloc.consumed], patched, f"entry of {fn.name}")

    # ------------------------------------------------------------- threads
    def register_thread(self, tid: int) -> None:
        """A ring for a thread the tracer stopped (none while the pool is on: the
        thread takes its own, and may be stopped in the middle of that)."""
        if self.rings is not None and not self.rings.closed and not self.threads.active:
            self.rings.register(tid, self.tracee.get_regs(tid).fs_base,
                                owner_word(self.tracee, tid, self.rings.owner_offset))

    def sequence_of(self, tid: int) -> int:
        """How many records the thread has written so far: an access made now
        lies between record number (this - 1) and record number (this)."""
        if self.rings is None or tid not in self.rings.thread_ring:
            return 0
        return self.rings.head_of(tid)

    def sequence_address(self, tid: int) -> int:
        """Where ``sequence_of(tid)`` lives in the tracer's memory (0: nowhere), for
        the data engine's C loop."""
        if self.rings is None:
            return 0
        return self.rings.head_address(tid)

    def thread_exited(self, tid: int) -> None:
        if self.rings is not None:
            self.rings.unregister(tid)

    # ------------------------------------------------------------- restore
    def restore(self, names: set[str] | None = None) -> int:
        """Un-patch functions (all if ``names`` is None); threads must be stopped."""
        restored = 0
        for fn in self.plan.functions if self.plan else []:
            if names is not None and fn.name not in names:
                continue
            addresses = self.patches_of.pop(fn.fid, [])
            gone = [self.patches.applied[a] for a in addresses if a in self.patches.applied]
            restored += self.patches.revert(self.tracee.mem, addresses)
            self.links.reverted(gone)       # and in the data engine's copies
        return restored

    def detach(self) -> None:
        """Restore all code, stop recording, drain what is left."""
        self._start_pending = False
        self.threads.detach()
        self.restore()
        if self.rings is not None:
            self.rings.set_enabled(False)
            if self.active:
                self.rings.stop()
        self.active = False

    def forget_after_exec(self) -> None:
        """The image was replaced: no patch exists any more, nothing to restore."""
        self._start_pending = False
        self.staged = None
        self.patches.applied.clear()
        self.patches_of.clear()
        if self.rings is not None and not self.rings.closed:
            self.rings.stop()
        self.active = False

    def forget_range(self, lo: int, hi: int) -> int:
        """A module was unmapped (dlclose): its patches went with it. Returns how many."""
        gone = [a for a in self.patches.applied if lo <= a < hi]
        self.staged = None
        self.links.forget_range(lo, hi)
        for address in gone:
            del self.patches.applied[address]
        for fid, addresses in list(self.patches_of.items()):
            addresses[:] = [a for a in addresses if not lo <= a < hi]
            if not addresses:
                del self.patches_of[fid]
        return len(gone)

    def fork_child(self, child: Tracee) -> None:
        """A fork child we leave untraced: put its code back.  A child forked
        before tracing started (its fork event handled only now) has none of it.
        Its copies of madtrace's areas are MadtraceAreas' (``child_released``)."""
        if not self.active or not child.is_mapped(self.rings.area.address):
            return
        self.patches.revert_copy(child.mem)

    def child_released(self, child: Tracee, kept: list) -> None:
        """After MadtraceAreas took madtrace's areas out of a fork child (its calls
        pending in trampolines given their real return addresses): if its thread
        may still need a trampoline, the child keeps the code and gets private
        copies of the rings with recording off, so that it never writes into ours."""
        if self.rings is not None and not self.rings.closed and \
                any(name.startswith("madtrace-rings") for name, _, _ in kept):
            private_rings(self.rings, self.injector, child)

    # ------------------------------------------------------------- results
    def _write_tables(self) -> None:
        self._tables_dirty = True
        if not self.defer_tables:
            self.flush_tables()

    def after_stop(self) -> None:
        """Attached, once the target runs again after ``install`` or ``add``: the drain
        starts, the rings registered meanwhile get their pages, mapped in the target too
        (1034 faults in a ring's first 4 MB: +5-20 ns per call in a VM), functions.json."""
        if self._start_pending and self.rings is not None and not self.rings.closed:
            self._start_pending = False
            self.rings.start()
        for address, size in self.rings.populate_pending() if self.rings is not None else ():
            self.tracee.mem.map_in(address, size)
        self.flush_tables()

    def flush_tables(self) -> None:
        """functions.json of the plan so far (if it changed)."""
        if not self._tables_dirty or self.plan is None:
            return
        self._tables_dirty = False
        if self.timestamps and self._tsc_hz is None:
            self._tsc_hz = tsc_hz()
        sites = [{"sid": s.sid, "function": s.function.name, "kind": s.kind,
                  "address": s.address, "caller": s.caller} for s in self.plan.sites]
        functions = [{"fid": f.fid, "name": f.name, "module": f.module.name, "address": f.address,
                      "size": f.size, "method": f.method, "reason": f.reason}
                     for f in self.plan.functions]
        with open(os.path.join(self.out_dir, FUNCTIONS_FILE), "w") as f:
            json.dump({"timestamps": self.timestamps,
                       "tsc_hz": self._tsc_hz, "tsc_flags": tsc_flags(),
                       "record_format": RECORD_FORMAT,
                       "sites": sites, "functions": functions, "report": self.report,
                       "relocated": [list(m) for m in sorted(self.moved_code)]}, f, indent=1)

    def original_return(self, address: int) -> int:
        """The program's own return address of a return address inside a call-site
        trampoline (the re-issued call's: ``return_points``), else ``address``."""
        for area in (*self.code_areas.values(), *self.retired_code_areas):
            original = area.area.return_points.get(address)
            if original is not None:
                return original
        return address

    def original_addresses(self, rips: np.ndarray) -> np.ndarray:
        """``rips`` (uint64) with each address inside a relocated prologue
        instruction replaced by the original instruction's address."""
        if not self.moved_code:
            return rips
        if self._moved_arrays is None:
            moved = sorted(self.moved_code)
            self._moved_arrays = tuple(np.array(col, dtype=np.uint64) for col in zip(*moved))
        new, original, size = self._moved_arrays
        i = np.searchsorted(new, rips, side="right").astype(np.int64) - 1
        j = np.maximum(i, 0)
        inside = (i >= 0) & (rips - new[j] < size[j])
        if not inside.any():
            return rips
        return np.where(inside, original[j] + (rips - new[j]), rips).astype(np.uint64)

    def call_counts(self, per_site=None) -> dict[str, int]:
        """Calls per function: the sum over its sites of ``per_site`` (calls per site
        id; default: the threads' counters so far)."""
        counts = {fn.name: 0 for fn in self.plan.functions if fn.method != "skipped"}
        if self.rings is None:
            return counts
        if per_site is None:
            per_site = self.rings.entry_counts
        for site in self.plan.sites:
            if site.sid < len(per_site) and site.function.name in counts:
                counts[site.function.name] += int(per_site[site.sid])
        return counts


class _Refused(Exception):
    pass
