# SPDX-License-Identifier: GPL-2.0-or-later
"""The address space of a live process: modules, their load bias, and
address -> symbol / region / variable lookups.

API
---
``Module``: ``name`` (basename, ``[vdso]`` for the vdso; ``basename`` is an
    alias), ``path``, ``bias`` (run-time address = bias + ELF address),
    ``image`` (``ElfImage``), ``start``/``end`` (extent of its mappings,
    including the anonymous ``.bss`` tail), ``mappings``, ``is_main``.
    ``absolute(sym)`` / ``relative(addr)`` / ``contains(addr)``.
``ModuleSymbol(module, symbol)`` (a NamedTuple, unpacks as a pair) with
    ``address`` (absolute), ``end``, ``name``, ``qualified``
    (``libc.so.6:malloc``).
``VariableRef(module, variable, offset)`` with ``address`` (absolute start
    of the variable) and ``describe()`` (``counters[3]``).
``AddressSpace``
    ``AddressSpace.from_pid(pid)``: reads /proc/PID/maps, loads every mapped
    ELF file (cached ElfImage) and the vdso from /proc/PID/mem.  Raises
    ``NoSuchProcessError`` / ``PermissionDeniedError``.
    ``AddressSpace.from_maps(mappings, reader=None, exe_path=None, pid=None)``:
    same from a mapping list; *reader(addr, size) -> bytes* reads memory
    (needed for the vdso; without it the vdso of madtrace's own process is
    used, which is the same kernel image).
    ``learn_modules(mappings, reader, pid)``: the modules of the maps read
    again that the space did not know (dlopen), added; returns them.
    Attributes: ``modules`` (main executable first, then by address),
    ``main``, ``mappings``, ``warnings`` (list of str).
    ``module_for(addr)``, ``module_named(name)``,
    ``symbolize(addr)`` -> ``compute+0x1c (prog)``, ``main (prog)`` at
    offset 0, else ``.bss+0x10 (prog)``, ``[heap]+0x2a0``, ``anon+0x8``;
    ``region(addr)`` -> ``.bss of prog``, ``.text of libc.so.6``,
    ``[heap]``, ``[stack]``, ``[vdso]``, ``anon``, or a file basename;
    ``find_functions(pattern)`` -> list[ModuleSymbol] (fnmatch glob,
    optionally ``module:glob`` where module is a basename, a basename
    prefix ending before a ``.``, or a glob; ``x@plt`` entries only match
    patterns containing ``@``); ``find_symbol(name)`` -> ModuleSymbol
    (``UnknownSymbolError`` when nothing matches); ``find_variable(name)``;
    ``variable_at(addr)`` -> VariableRef | None (DWARF, falling back to
    OBJECT symbols); ``counts()`` -> {module: {symbols, functions, objects,
    plt, variables?, stripped}}; ``stripped_modules()``.
All lookups by address use sorted start lists and ``bisect``.
"""

from __future__ import annotations

import bisect
import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from madtrace.errors import (
    MadtraceError,
    NotElfError,
    UnknownSymbolError,
)

from ..cache.disk import build_id
from .dwarf_vars import Variable, describe_in_variable
from .elf import ElfImage, Symbol
from .maps import Mapping, read_maps

VDSO = "[vdso]"
_SCOPED = re.compile(r"^([^:]+):(?!:)(.*)$")


@dataclass(eq=False)
class Module:
    name: str
    path: str
    bias: int
    image: ElfImage
    start: int
    end: int
    mappings: list = field(default_factory=list)
    is_main: bool = False

    @property
    def basename(self) -> str:
        return self.name

    def absolute(self, sym_or_addr) -> int:
        addr = sym_or_addr.address if hasattr(sym_or_addr, "address") else sym_or_addr
        return self.bias + addr

    def relative(self, addr: int) -> int:
        return addr - self.bias

    def contains(self, addr: int) -> bool:
        return self.start <= addr < self.end

    def __repr__(self) -> str:
        return f"<Module {self.name} bias={self.bias:#x} [{self.start:#x}-{self.end:#x})>"


class ModuleSymbol(NamedTuple):
    module: Module
    symbol: Symbol

    @property
    def address(self) -> int:
        return self.module.bias + self.symbol.address

    @property
    def end(self) -> int:
        return self.address + self.symbol.size

    @property
    def name(self) -> str:
        return self.symbol.name

    @property
    def qualified(self) -> str:
        return f"{self.module.name}:{self.symbol.name}"


class VariableRef(NamedTuple):
    module: Module
    variable: Variable
    offset: int

    @property
    def address(self) -> int:
        return self.module.bias + self.variable.address

    def describe(self) -> str:
        return describe_in_variable(self.variable, self.offset)


def _module_matches(modname: str, pattern: str) -> bool:
    if modname == pattern:
        return True
    if modname.startswith(pattern) and modname[len(pattern)] in ".-":
        return True
    return any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(modname, pattern)


def _split_scope(pattern: str):
    m = _SCOPED.match(pattern)
    if m and not pattern.startswith("["):
        return m.group(1), m.group(2)
    if pattern.startswith("[") and "]:" in pattern:  # [vdso]:name
        mod, _, rest = pattern.partition("]:")
        return mod + "]", rest
    return None, pattern


class SpecElsewhereError(UnknownSymbolError):
    """A function spec names nothing as given, but matches in other modules (the
    message says where): a mistake to report at once, never a pending spec."""


def _trim_extents(modules: list[Module]) -> None:
    """An extent computed from PT_LOAD must not swallow the next module."""
    ordered = sorted(modules, key=lambda m: m.start)
    for a, b in zip(ordered, ordered[1:]):
        if a.end > b.start:
            a.end = max(b.start, max(m.end for m in a.mappings) if a.mappings else a.start)


class AddressSpace:
    """Modules and regions of one process (see module docstring)."""

    def __init__(self, mappings: list[Mapping], modules: list[Module], warnings: list[str]):
        self.warnings = warnings
        self._index(mappings, modules)

    def _index(self, mappings: list[Mapping], modules: list[Module]) -> None:
        self.mappings = sorted(mappings, key=lambda m: m.start)
        by_addr = sorted(modules, key=lambda m: m.start)
        self._mod_starts = [m.start for m in by_addr]
        self._mods_by_addr = by_addr
        self.modules = sorted(modules, key=lambda m: (not m.is_main, m.start))
        self.main = next((m for m in self.modules if m.is_main), None)
        self._map_starts = [m.start for m in self.mappings]
        regions = []
        for mod in modules:
            if mod.name == VDSO:
                continue
            for s in mod.image.sections:
                if s.is_alloc and not s.is_tls and s.size and s.address:
                    regions.append((mod.bias + s.address, mod.bias + s.address + s.size,
                                    s.name, mod))
        regions.sort(key=lambda r: r[0])
        self._regions = regions
        self._region_starts = [r[0] for r in regions]

    @property
    def sections(self) -> list[tuple]:
        """(start, end, section name, module) of every allocated section, by address."""
        return self._regions

    # ------------------------------------------------------------ construction
    @classmethod
    def from_pid(cls, pid: int) -> "AddressSpace":
        mappings = read_maps(pid)
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = None

        from ..process.memory import ProcessMemory   # a live process: the tracer's side only
        with ProcessMemory(pid) as memory:
            return cls.from_maps(mappings, memory.read, exe_path=exe, pid=pid)

    @classmethod
    def from_maps(cls, mappings: list[Mapping], reader: Callable[[int, int], bytes] | None = None,
                  exe_path: str | None = None, pid: int | None = None) -> "AddressSpace":
        warnings: list[str] = []
        groups: dict[tuple, list[Mapping]] = {}
        vdso_map = None
        for m in sorted(mappings, key=lambda m: m.start):
            if m.is_file and m.inode:
                groups.setdefault((m.file_path, m.dev, m.inode), []).append(m)
            elif m.path == VDSO:
                vdso_map = m
        modules: list[Module] = []
        for (path, _dev, _inode), maps in groups.items():
            image = cls._load_file(path, maps, pid, warnings)
            if image is None:
                continue
            bias = None
            for m in maps:
                bias = image.load_bias(m.start, m.offset)
                if bias is not None:
                    break
            if bias is None:
                continue  # an ELF file mapped as plain data
            start = min(m.start for m in maps)
            end = max(max(m.end for m in maps), bias + image.load_end())
            is_main = exe_path is not None and path == exe_path.removesuffix(" (deleted)")
            modules.append(Module(os.path.basename(path), path, bias, image, start, end,
                                  maps, is_main))
        if vdso_map is not None:
            mod = cls._load_vdso(vdso_map, reader, warnings)
            if mod is not None:
                modules.append(mod)
        if modules and not any(m.is_main for m in modules):
            # no /proc/PID/exe: the executable is the lowest non-shared ELF
            cands = [m for m in modules if m.name != VDSO and not m.image.is_shared]
            if cands:
                min(cands, key=lambda m: m.start).is_main = True
        _trim_extents(modules)
        return cls(mappings, modules, warnings)

    def learn_modules(self, mappings: list[Mapping], reader: Callable[[int, int], bytes] | None
                      = None, pid: int | None = None) -> list[Module]:
        """The modules of ``mappings`` (the process's maps read again) that this
        space does not know yet, added to it: a library loaded by dlopen since.
        The modules known stay as they are (a module unmapped since stays too:
        its code may still be named)."""
        known = {(m.path, m.start) for m in self.modules}
        fresh = AddressSpace.from_maps([m for m in mappings if m.path != VDSO], reader, pid=pid)
        added = [m for m in fresh.modules if (m.path, m.start) not in known
                 and self.module_for(m.start) is None]
        if added:
            for m in added:
                m.is_main = False
            modules = self._mods_by_addr + added
            _trim_extents(modules)
            self._index(mappings, modules)
            self.warnings.extend(fresh.warnings)
        return added

    @staticmethod
    def _load_file(path, maps, pid, warnings):
        try:
            return ElfImage.load(path)
        except NotElfError as e:
            if os.path.exists(path):
                return None  # not an ELF file (locale archive, font, data file...)
            reason = str(e)
        if pid is not None:  # deleted or not visible here: go through map_files
            m = maps[0]
            alt = f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"
            try:
                return ElfImage.load(alt)
            except NotElfError as e:
                reason = str(e)
        warnings.append(f"cannot load {path}: {reason}")
        return None

    @staticmethod
    def _load_vdso(m: Mapping, reader, warnings) -> Module | None:
        data = None
        if reader is not None:
            try:
                data = reader(m.start, m.size)
            except (MadtraceError, OSError) as e:
                warnings.append(f"cannot read the vdso of the target: {e}; using madtrace's own")
        if data is None:
            try:
                own = next((x for x in read_maps(os.getpid()) if x.path == VDSO), None)
                if own is not None:     # madtrace's own memory, not the target's
                    with open("/proc/self/mem", "rb", buffering=0) as own_memory:
                        own_memory.seek(own.start)
                        data = own_memory.read(own.size)
            except (MadtraceError, OSError) as e:
                warnings.append(f"cannot read the vdso: {e}")
        if not data:
            return None
        try:
            image = ElfImage.from_bytes(data, VDSO)
        except NotElfError as e:
            warnings.append(f"vdso: {e}")
            return None
        bias = image.load_bias(m.start, m.offset)
        if bias is None:
            bias = m.start
        return Module(VDSO, VDSO, bias, image, m.start, m.end, [m], False)

    # ------------------------------------------------------------------ lookup
    def module_for(self, addr: int) -> Module | None:
        i = bisect.bisect_right(self._mod_starts, addr) - 1
        if i >= 0 and self._mods_by_addr[i].contains(addr):
            return self._mods_by_addr[i]
        return None

    def module_named(self, name: str) -> Module | None:
        for m in self.modules:
            if m.name == name or m.path == name:
                return m
        for m in self.modules:
            if _module_matches(m.name, name):
                return m
        return None

    def mapping_for(self, addr: int) -> Mapping | None:
        i = bisect.bisect_right(self._map_starts, addr) - 1
        if i >= 0 and self.mappings[i].contains(addr):
            return self.mappings[i]
        return None

    def _section_region(self, addr: int):
        i = bisect.bisect_right(self._region_starts, addr) - 1
        if i >= 0:
            r = self._regions[i]
            if r[0] <= addr < r[1]:
                return r
        return None

    def region(self, addr: int) -> str:
        """``.bss of prog``, ``.text of libc.so.6``, ``[heap]``, ``[stack]``,
        ``[vdso]``, ``anon``, a file basename, or ``unmapped``."""
        r = self._section_region(addr)
        if r is not None:
            return f"{r[2]} of {r[3].name}"
        m = self.mapping_for(addr)
        if m is not None:
            return m.label
        mod = self.module_for(addr)
        if mod is not None:
            return mod.name
        return "unmapped"

    def symbolize(self, addr: int) -> str:
        mod = self.module_for(addr)
        if mod is not None:
            sym = mod.image.symbol_at(addr - mod.bias)
            if sym is not None:
                off = addr - mod.bias - sym.address
                return f"{sym.name}+{off:#x} ({mod.name})" if off else f"{sym.name} ({mod.name})"
        r = self._section_region(addr)
        if r is not None:
            return f"{r[2]}+{addr - r[0]:#x} ({r[3].name})"
        m = self.mapping_for(addr)
        if m is not None:
            return f"{m.label}+{addr - m.start:#x}"
        if mod is not None:
            return f"{mod.name}+{addr - mod.start:#x}"
        return f"{addr:#x}"

    def code_location(self, addr: int, decimal: bool = False) -> str:
        """``function+0xoff`` of a code address, always with its offset (decimal
        with ``decimal``, as MadT writes call sites: ``function+230``):
        ``module+0xoff`` without a symbol (hex then too: a module's offsets are
        read against its disassembly), the bare address outside every module."""
        mod = self.module_for(addr)
        if mod is None:
            return f"{addr:#x}"
        rel = addr - mod.bias
        sym = mod.image.symbol_at(rel)
        name, off = (sym.name, rel - sym.address) if sym is not None else (mod.name, rel)
        return f"{name}+{off}" if decimal and sym is not None else f"{name}+{off:#x}"

    def _modules_for_scope(self, scope):
        if scope is None:
            return self.modules
        return [m for m in self.modules if _module_matches(m.name, scope)]

    def find_functions(self, pattern: str) -> list[ModuleSymbol]:
        """Functions whose name matches the glob *pattern* (see module doc)."""
        scope, pat = _split_scope(pattern)
        match = re.compile(fnmatch.translate(pat)).match
        want_plt = "@" in pat
        exact = not any(c in pat for c in "*?[")     # a plain name: the index, no scan
        out: list[ModuleSymbol] = []
        for mod in self._modules_for_scope(scope):
            candidates = mod.image.symbols_named(pat) if exact else mod.image.symbols
            syms = [s for s in candidates if s.kind in ("FUNC", "IFUNC") and match(s.name)]
            if want_plt:
                syms += [s for s in mod.image.plt_symbols if match(s.name)]
            syms.sort(key=lambda s: (s.address, s.name))
            out.extend(ModuleSymbol(mod, s) for s in syms)
        return out

    def functions_for_spec(self, spec: str) -> list[ModuleSymbol]:
        """The functions a user's spec names (-f, the REPL's funcs and instrument):
        ``module:GLOB`` those of the matching modules (``*:GLOB``: of every module);
        a bare name or glob those of the main executable; a bare *name* the main
        executable does not define, the one definition in the other modules that the
        dynamic linker binds it to (``-f malloc``: libc.so.6's).  Only definitions
        (size > 0).  Raises UnknownSymbolError saying where a bare spec does exist
        when it names nothing in the main executable."""
        scope, pattern = _split_scope(spec)
        if scope is not None or self.main is None:
            return [ms for ms in self.find_functions(spec) if ms.symbol.size > 0]
        found = [ms for ms in self.find_functions(f"{self.main.name}:{pattern}") if ms.symbol.size > 0]
        if found:
            return found
        elsewhere: dict[str, list[ModuleSymbol]] = {}
        for ms in self.find_functions(f"*:{pattern}"):
            if ms.symbol.size > 0 and not ms.module.is_main:
                elsewhere.setdefault(ms.module.name, []).append(ms)
        if not elsewhere:
            raise UnknownSymbolError(f"no function matches {spec!r}")
        if any(c in pattern for c in "*?["):
            ranked = sorted(elsewhere.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:3]
            hints = ", ".join(f"'{module}:{pattern}' ({len(found)} functions)" for module, found in ranked)
            raise SpecElsewhereError(f"no function of {self.main.name} matches {spec!r}; "
                                     f"did you mean {hints}?")
        exported = {module: [ms for ms in found if ms.symbol.dynamic and ms.symbol.binding != "LOCAL"]
                    for module, found in elsewhere.items()}
        exported = {module: found for module, found in exported.items() if found}
        chosen = exported if exported else elsewhere
        if len(chosen) > 1:
            names = ", ".join(f"'{module}:{pattern}'" for module in sorted(chosen))
            raise SpecElsewhereError(f"{spec!r} is defined by several modules ({names}): name one")
        return next(iter(chosen.values()))

    def find_symbol(self, name: str) -> ModuleSymbol:
        """The best symbol called *name* (``mod:name`` scopes it); main
        executable first, then the other modules by address."""
        scope, bare = _split_scope(name)
        local = None
        for mod in self._modules_for_scope(scope):
            cands = [s for s in mod.image.symbols_named(bare) if s.kind != "TLS"]
            if not cands:
                continue
            if cands[0].binding != "LOCAL":  # symbols_named sorts best first
                return ModuleSymbol(mod, cands[0])
            if local is None:
                local = ModuleSymbol(mod, cands[0])
        if local is None:
            raise UnknownSymbolError(f"unknown symbol: {name}")
        return local

    def find_variable(self, name: str) -> VariableRef:
        """A global/static variable by name: DWARF first, then OBJECT symbols."""
        scope, bare = _split_scope(name)
        mods = self._modules_for_scope(scope)
        for mod in mods:
            vs = mod.image.variables_named(bare)
            if vs:
                return VariableRef(mod, vs[0], 0)
        for mod in mods:
            for s in mod.image.symbols_named(bare):
                if s.kind in ("OBJECT", "COMMON"):
                    return VariableRef(mod, Variable(s.name, s.address, s.size), 0)
        raise UnknownSymbolError(f"unknown variable: {name}")

    def variable_at(self, addr: int) -> VariableRef | None:
        mod = self.module_for(addr)
        if mod is None:
            return None
        rel = addr - mod.bias
        v = mod.image.variable_at(rel)
        if v is not None:
            return VariableRef(mod, v, rel - v.address)
        s = mod.image.symbol_at(rel)
        if s is not None and s.kind in ("OBJECT", "COMMON"):
            return VariableRef(mod, Variable(s.name, s.address, s.size), rel - s.address)
        return None

    def stripped_modules(self) -> list[Module]:
        return [m for m in self.modules if m.image.stripped and m.name != VDSO]

    def counts(self) -> dict[str, dict]:
        out = {}
        for m in self.modules:
            img = m.image
            funcs = sum(1 for s in img.symbols if s.kind in ("FUNC", "IFUNC"))
            objs = sum(1 for s in img.symbols if s.kind == "OBJECT")
            entry = {"symbols": len(img.symbols), "functions": funcs, "objects": objs,
                     "plt": len(img.plt), "stripped": img.stripped,
                     "build_id": build_id(img) if m.name != VDSO else None}
            if img.variables_read is not None:
                entry["variables"] = len(img.variables_read)
            out[m.name] = entry
        return out
