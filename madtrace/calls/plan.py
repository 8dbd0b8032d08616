"""Which functions to trace, and how each one is patched.

Every selected function gets exactly one method, so no call is counted twice:
- ``callsite`` (HMTT_FBI): each direct ``call rel32`` / ``jmp rel32`` to it in
  its module becomes a ``jmp`` to a per-site trampoline.  Exact only when
  every call is direct: the function is local to its module's code (not
  exported, so no other module calls it through a PLT) and its address is
  never taken (no call through a pointer).
- ``entry``: the first instructions are relocated into an entry trampoline
  that also redirects the return address to an exit stub (a per-thread
  shadow stack keeps the real one).  Used for exported and address-taken
  functions, and where some direct site cannot be patched (a 2-byte jmp).
A function that fits neither exactly is reported in ``skipped`` or
``inexact`` with the reason; the patch report lists them all.

In a module that uses C++ exceptions, call sites are patched only when the
target's unwinder can be told about the trampolines (``cxx_unwind``: see
unwind.py); entry patching is not used there, because an exception cannot
unwind through an exit stub (the return address it finds is the stub's).
"""

from __future__ import annotations

import bisect
import weakref
from dataclasses import dataclass, field
from typing import Callable

from ..binary.address_space import AddressSpace, Module, ModuleSymbol, SpecElsewhereError
from ..errors import UnknownSymbolError, UsageError
from .scan_cache import scan_of

# functions that must never be entry-patched: they do not return normally or run
# before the thread can have a registered slot
NEVER_ENTRY = frozenset({"_start", "_init", "_fini", "_dl_relocate_static_pie", "__libc_csu_init",
                         "__libc_csu_fini", "deregister_tm_clones", "register_tm_clones",
                         "__do_global_dtors_aux", "frame_dummy"})


@dataclass
class TracedFunction:
    fid: int
    name: str           # key in summaries: plain name, "module:name" if the plain one is taken
    module: Module
    address: int        # absolute
    size: int
    method: str         # "callsite" | "entry"
    reason: str         # why this method
    site_ids: list[int] = field(default_factory=list)
    inexact: str | None = None


@dataclass
class Site:
    sid: int
    function: TracedFunction
    kind: str           # "call" | "tail" | "entry"
    address: int        # absolute address of the patched instruction (or function start)
    caller: str | None


@dataclass
class Plan:
    functions: list[TracedFunction] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (what, why)
    scans: dict = field(default_factory=dict)   # module name -> _ModuleScan

    def add_site(self, function: TracedFunction, kind: str, address: int, caller) -> Site:
        site = Site(len(self.sites), function, kind, address, caller)
        self.sites.append(site)
        function.site_ids.append(site.sid)
        return site


# the last selection per address space (``prepare_plan`` then ``make_plan`` ask twice)
_selections: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def select_functions(space: AddressSpace, patterns: list[str]) -> list[ModuleSymbol]:
    """The functions of the specs (AddressSpace.functions_for_spec: unscoped globs
    the main executable's, a bare name its definition, 'lib:pattern' a module's)."""
    key = (tuple(patterns), tuple((m.name, m.bias) for m in space.modules))
    last = _selections.get(space)
    if last is not None and last[0] == key:
        return list(last[1])
    chosen: dict[int, ModuleSymbol] = {}
    for pattern in patterns:
        found = space.functions_for_spec(pattern)
        if not found:
            raise UnknownSymbolError(f"no function matches {pattern!r}")
        for ms in found:
            chosen.setdefault(ms.address, ms)   # aliases share an address: trace once
    selected = sorted(chosen.values(), key=lambda ms: ms.address)
    _selections[space] = (key, selected)
    return list(selected)


def split_patterns(space: AddressSpace, patterns: list[str]) -> tuple[list[str], list[str]]:
    """(patterns that match a function of ``space`` now, those that match none yet:
    pending until an exec or a dlopen brings a module that defines them)."""
    matched, pending = [], []
    for pattern in patterns:
        try:
            select_functions(space, [pattern])
            matched.append(pattern)
        except SpecElsewhereError:
            raise
        except UnknownSymbolError:
            pending.append(pattern)
    return matched, pending


# a module that uses these may throw or catch C++ exceptions: an exception unwinding
# through a trampoline or an exit stub with no unwind info would terminate the program
CXX_EXCEPTION_SYMBOLS = ("__gxx_personality_v0", "__cxa_throw", "__cxa_begin_catch", "_Unwind_Resume")


def uses_cxx_exceptions(module: Module) -> bool:
    image = module.image
    names = {s.name for s in image.symbols if s.dynamic} | {n.split("@")[0] for n in image.plt}
    return any(name in names for name in CXX_EXCEPTION_SYMBOLS)


# the scan of each ELF image (images are cached per file: binary/elf.py), so that a
# module is scanned once per tracer process, whichever session instruments it; and
# once per binary file on disk (scan_cache.py), whichever process
_image_scans: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def module_scan(module: Module):
    """The module's CallSiteScan (its direct branches among them), once per image."""
    return _ModuleScan(module).scan


class _ModuleScan:
    """Call sites and address-taken functions of one module, computed once per
    image (all ELF-relative)."""

    def __init__(self, module: Module):
        self.module = module
        cached = _image_scans.get(module.image)
        if cached is None:
            scan, taken = scan_of(module.image)
            unpatchable_by_target: dict[int, list] = {}
            for item in scan.unpatchable:
                unpatchable_by_target.setdefault(item.target, []).append(item)
            cached = (uses_cxx_exceptions(module), scan, taken, unpatchable_by_target)
            _image_scans[module.image] = cached
        self.cxx, self.scan, self.taken, self.unpatchable_by_target = cached

    def early_site(self, target: int):
        """A direct call or jmp to ``target`` that starts in the first 5 bytes of a
        function (ELF-relative), or None.  Entry patching of that function moves
        its first instructions into a trampoline (and writes its jump over them),
        so a call-site patch there would be written over that jump (the program
        then crashes), or lost with the moved copy; the callee is patched at its
        entry instead."""
        starts = self.__dict__.get("_starts")
        if starts is None:
            starts = self.__dict__["_starts"] = sorted(self.scan.function_starts)
        for site in self.scan.sites_to(target):
            i = bisect.bisect_right(starts, site.insn_address) - 1
            if i >= 0 and site.insn_address - starts[i] < 5:
                return site
        return None


def _implementation_size(scan: _ModuleScan, rel: int) -> int:
    """Size of a function known only by its start (an IFUNC implementation in a
    stripped library): up to the next known function start."""
    starts = sorted(scan.scan.function_starts)
    i = bisect.bisect_right(starts, rel)
    return min(starts[i] - rel, 1 << 16) if i < len(starts) else 64


def prepare_plan(space: AddressSpace, patterns: list[str]) -> None:
    """What ``make_plan`` needs from the files alone, done ahead (no target
    access): the functions exist, their modules are scanned (kept per image),
    and every module's names are indexed (FunctionTracer looks up the unwinder's
    functions in all of them: 77 of the 90 ms http.server was stopped for its
    first ``instrument`` of 20 functions, before this)."""
    for module in {ms.module.name: ms.module for ms in select_functions(space, patterns)}.values():
        _ModuleScan(module)
    for name in UNWINDER_FUNCTIONS:
        space.find_functions(name)


METHODS = ("auto", "callsite", "entry")
# what FunctionTracer looks up in the target's unwinder (engine.py)
UNWINDER_FUNCTIONS = ("_Unwind_RaiseException", "__register_frame_info", "__deregister_frame_info")


def make_plan(space: AddressSpace, patterns: list[str],
              resolve_ifunc: Callable[[ModuleSymbol], int] | None = None,
              method: str = "auto", cxx_unwind: bool = False) -> Plan:
    """``resolve_ifunc`` returns the absolute address of the implementation an
    IFUNC resolves to in the target (its resolver runs there).  ``method``
    forces one patching method for every function ("auto": the exact one).
    ``cxx_unwind``: unwind information for call-site trampolines can be
    registered in the target (modules with C++ exceptions get call sites)."""
    if method not in METHODS:
        raise UsageError(f"--method must be one of {', '.join(METHODS)}")
    forced = method
    plan = Plan()
    scans = plan.scans
    names_used: set[str] = set()
    for ms in select_functions(space, patterns):
        module, sym = ms.module, ms.symbol
        scan = scans.get(module.name) or scans.setdefault(module.name, _ModuleScan(module))
        name = sym.name if sym.name not in names_used else f"{module.name}:{sym.name}"
        names_used.add(name)
        if scan.cxx and not cxx_unwind:
            plan.skipped.append((name, f"{module.name} uses C++ exceptions and the target has no "
                                       "__register_frame_info to unwind through trampolines"))
            continue
        if sym.kind == "IFUNC":
            if resolve_ifunc is None:
                plan.skipped.append((name, "IFUNC: its implementation is chosen at run time"))
                continue
            impl = resolve_ifunc(ms)
            rel = impl - module.bias
            known = module.image.symbol_at(rel)
            size = known.size if known is not None and known.address == rel and known.size \
                else _implementation_size(scan, rel)
            impl_name = known.name if known is not None and known.address == rel else f"{impl:#x}"
            fn = TracedFunction(len(plan.functions), name, module, impl, size, "entry",
                                f"IFUNC resolved to {impl_name}: called through GOT entries")
            plan.functions.append(fn)
            plan.add_site(fn, "entry", impl, None)
            continue
        rel = sym.address
        if sym.dynamic and sym.binding != "LOCAL":
            chosen, reason = "entry", "exported: other modules call it through their PLT"
        elif rel in scan.taken:
            chosen, reason = "entry", "address taken: may be called through a pointer"
        elif rel in scan.unpatchable_by_target:
            chosen, reason = "entry", scan.unpatchable_by_target[rel][0].reason
        elif not scan.cxx and (early := scan.early_site(rel)) is not None:
            chosen, reason = "entry", (f"called at {early.insn_address:#x}, in the first bytes of "
                                       f"{early.caller or 'its caller'}, which entry patching moves")
        else:
            chosen, reason = "callsite", "every call is a direct call or jmp rel32"
        if forced != "auto" and forced != chosen:
            chosen, reason = forced, f"forced by --method {forced} (auto: {chosen}, {reason})"
        if chosen == "entry" and scan.cxx:
            plan.skipped.append((name, f"{reason}; but {module.name} uses C++ exceptions, which "
                                       "cannot unwind through an exit stub (--method callsite "
                                       "counts its direct calls)"))
            continue
        if chosen == "entry" and sym.name in NEVER_ENTRY:
            plan.skipped.append((name, "start-up code: called by the loader before tracing "
                                       "starts, or never returns"))
            continue
        fn = TracedFunction(len(plan.functions), name, module, ms.address, sym.size, chosen, reason)
        plan.functions.append(fn)
        if chosen == "entry":
            plan.add_site(fn, "entry", ms.address, None)
        else:
            # direct calls of the function, and of its own PLT stub (calls of an exported
            # function from inside its module go through the PLT unless bound locally)
            targets = [rel]
            plt_stub = module.image.plt.get(f"{sym.name}@plt")
            if plt_stub is not None:
                targets.append(plt_stub)
            for target in targets:
                for site in scan.scan.sites_to(target):
                    plan.add_site(fn, "call" if site.kind == "call" else "tail",
                                  module.bias + site.address, site.caller)
            if rel in scan.taken or (sym.dynamic and sym.binding != "LOCAL"):
                fn.inexact = "calls through pointers or other modules are not seen"
            elif rel in scan.unpatchable_by_target:
                fn.inexact = f"{len(scan.unpatchable_by_target[rel])} direct sites cannot be patched"
    return plan
