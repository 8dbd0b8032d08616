# SPDX-License-Identifier: GPL-2.0-or-later
"""The static model of one ELF x86-64 file: symbols, sections, PLT, DWARF.

Symbols and sections are read with a small ``struct``-based reader written
for this purpose, not with lief or pyelftools: on libpython3.11.so.1.0
(16.7k symbols) it takes ~0.03 s where ``lief.ELF.parse`` + iteration takes
~0.07 s (plus 0.33 s to import lief) and pyelftools ~0.5 s.  pyelftools is
not used at run time: DWARF is read by mtdwarf (libdw) once per binary and
cached on disk (dwarf_cache.py); pyelftools reads it in the tests, as an oracle.

API
---
``Symbol`` (frozen): ``name``, ``address`` (= st_value, relative to the ELF;
    add the module bias for a run-time address), ``size``, ``kind``
    (``FUNC`` ``OBJECT`` ``NOTYPE`` ``TLS`` ``IFUNC`` ``COMMON`` or ``PLT``
    for synthesized ``malloc@plt`` entries), ``binding`` (``LOCAL``
    ``GLOBAL`` ``WEAK`` ``UNIQUE``), ``section`` (st_shndx), ``dynamic``
    (True when the symbol is in ``.dynsym``).  ``is_function``.
``Section`` (frozen): ``name``, ``address``, ``size``, ``offset``, ``type``,
    ``flags`` (raw sh_flags), ``index``; ``is_alloc`` ``is_write``
    ``is_exec`` ``is_tls`` ``flag_str``.
``Segment`` (frozen): ``type``, ``offset``, ``vaddr``, ``filesz``,
    ``memsz``, ``flags``, ``align``.
``ElfImage``
    ``ElfImage.load(path)`` (cached per (path, dev, inode, mtime) in the
    process) and ``ElfImage.from_bytes(data, name)``.  Both raise
    ``NotElfError`` for anything that is not a readable ELF64 x86-64 file.
    Attributes: ``path``, ``name``, ``elf_type`` (``EXEC``/``DYN``),
    ``is_pie``, ``is_shared``, ``entry``, ``symbols`` (list, deduplicated on
    name+address, undefined/SECTION/FILE/ABS symbols dropped),
    ``plt`` (``{"malloc@plt": relative address}``, first stub of a name),
    ``plt_symbols`` (every stub as a ``Symbol`` of kind ``PLT``; IRELATIVE
    stubs are named after their IFUNC, e.g. ``strnlen@plt``, else
    ``*ABS*+0x9f550@plt`` like objdump),
    ``sections``, ``segments``, ``stripped`` (no ``.symtab``),
    ``has_debug_info`` (a ``.debug_info`` section).
    Methods: ``section(name)``, ``section_at(addr)``, ``symbols_named(name)``,
    ``symbol_at(addr)`` (containing symbol, relative address),
    ``functions()``, ``load_bias(mapping_start, mapping_offset)``,
    ``variables()`` (DWARF globals/statics, lazy, see ``dwarf_vars``),
    ``variable_at(addr)``, ``read(offset, size)``.
"""

from __future__ import annotations

import bisect
import io
import mmap
import os
import struct
from dataclasses import dataclass, replace

from madtrace.errors import NotElfError

from . import plt as _plt

ET_EXEC, ET_DYN = 2, 3
EM_X86_64 = 62
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_DYNSYM = 2, 4, 8, 11
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS = 0x1, 0x2, 0x4, 0x400
SHN_UNDEF, SHN_LORESERVE, SHN_ABS, SHN_COMMON = 0, 0xFF00, 0xFFF1, 0xFFF2
DT_SONAME, DT_FLAGS_1 = 14, 0x6FFFFFFB
DF_1_PIE = 0x08000000
R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT, R_X86_64_IRELATIVE = 6, 7, 37

_ABS_PREFIX = "*ABS*+"
_KINDS = {0: "NOTYPE", 1: "OBJECT", 2: "FUNC", 5: "COMMON", 6: "TLS", 10: "IFUNC"}
_BINDINGS = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK", 10: "UNIQUE"}
FUNCTION_KINDS = frozenset(("FUNC", "IFUNC", "PLT"))
# kinds whose st_value is a (relative) address worth symbolizing
ADDRESS_KINDS = frozenset(("FUNC", "IFUNC", "OBJECT", "NOTYPE", "PLT", "COMMON"))

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_PHDR = struct.Struct("<IIQQQQQQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")
_DYN = struct.Struct("<qQ")


@dataclass(frozen=True, slots=True)
class Symbol:
    name: str
    address: int
    size: int
    kind: str
    binding: str
    section: int = 0
    dynamic: bool = False

    @property
    def is_function(self) -> bool:
        return self.kind in FUNCTION_KINDS

    def contains(self, addr: int) -> bool:
        return self.address <= addr < self.address + max(self.size, 1)


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    address: int
    size: int
    offset: int
    type: int
    flags: int
    index: int

    @property
    def is_alloc(self) -> bool:
        return bool(self.flags & SHF_ALLOC)

    @property
    def is_write(self) -> bool:
        return bool(self.flags & SHF_WRITE)

    @property
    def is_exec(self) -> bool:
        return bool(self.flags & SHF_EXECINSTR)

    @property
    def is_tls(self) -> bool:
        return bool(self.flags & SHF_TLS)

    @property
    def flag_str(self) -> str:
        return ("W" if self.is_write else "") + ("A" if self.is_alloc else "") + (
            "X" if self.is_exec else ""
        )


@dataclass(frozen=True, slots=True)
class Segment:
    type: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    flags: int
    align: int


def _symbol_rank(s: Symbol):
    """Sort key: smaller is a better name for an address."""
    kind = {"FUNC": 0, "IFUNC": 0, "OBJECT": 0, "PLT": 1, "COMMON": 1}.get(s.kind, 2)
    bind = {"GLOBAL": 0, "UNIQUE": 0, "WEAK": 1}.get(s.binding, 2)
    underscores = len(s.name) - len(s.name.lstrip("_"))
    return (kind, 0 if s.size else 1, bind, underscores, len(s.name), s.name)


_cache: dict[tuple, "ElfImage"] = {}


def parsed_images() -> list[tuple[str, "ElfImage"]]:
    """(path, image) of every ELF file this process has parsed and keeps (ElfImage.load)."""
    return [(key[0], image) for key, image in list(_cache.items())]


class ElfImage:
    """Parsed ELF64 x86-64 file (see module docstring)."""

    def __init__(self, data, name: str, path: str | None = None):
        self._data = data
        self.path = path
        self.name = name
        self._variables = None
        self._var_index = None
        self._addr_index = None
        self._by_name = None
        try:
            self._parse()
        except NotElfError:
            raise
        except (struct.error, IndexError, ValueError, OverflowError, UnicodeError) as e:
            raise NotElfError(f"{name}: truncated or corrupt ELF file ({e})") from None

    # ----------------------------------------------------------- construction
    @classmethod
    def load(cls, path: str) -> "ElfImage":
        """Parse the ELF file at *path* (cached per path/inode/mtime)."""
        try:
            st = os.stat(path)
        except OSError as e:
            raise NotElfError(f"cannot read {path}: {e.strerror}") from None
        key = (os.path.abspath(path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        img = _cache.get(key)
        if img is not None:
            return img
        try:
            with open(path, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    raise NotElfError(f"{path}: not an ELF file")
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except NotElfError:
            raise
        except (OSError, ValueError) as e:
            raise NotElfError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
        img = cls(data, os.path.basename(path), path)
        _cache[key] = img
        return img

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> "ElfImage":
        """Parse an in-memory ELF image (e.g. the vdso read from /proc/PID/mem)."""
        return cls(bytes(data), name, None)

    # ---------------------------------------------------------------- parsing
    def _parse(self) -> None:
        d = self._data
        if len(d) < _EHDR.size or d[:4] != b"\x7fELF":
            raise NotElfError(f"{self.name}: not an ELF file")
        ident = d[:16]
        if ident[4] != 2 or ident[5] != 1:
            raise NotElfError(f"{self.name}: not a 64-bit little-endian ELF file")
        (_, e_type, e_machine, _, e_entry, e_phoff, e_shoff, _, _,
         e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx) = _EHDR.unpack_from(d, 0)
        if e_machine != EM_X86_64:
            raise NotElfError(f"{self.name}: not an x86-64 ELF file (e_machine={e_machine})")
        if e_type not in (ET_EXEC, ET_DYN):
            raise NotElfError(f"{self.name}: not an executable or shared object (e_type={e_type})")
        self.elf_type = "EXEC" if e_type == ET_EXEC else "DYN"
        self.entry = e_entry

        self.segments = [
            Segment(*(_PHDR.unpack_from(d, e_phoff + i * e_phentsize)[j] for j in (0, 2, 3, 5, 6, 1, 7)))
            for i in range(e_phnum if e_phentsize else 0)
        ]
        self.loads = [s for s in self.segments if s.type == PT_LOAD]

        raw = []
        if e_shoff and e_shentsize:
            if e_shnum == 0:  # extended numbering: real count in section 0's sh_size
                e_shnum = _SHDR.unpack_from(d, e_shoff)[5]
            raw = [_SHDR.unpack_from(d, e_shoff + i * e_shentsize) for i in range(e_shnum)]
        names_off = raw[e_shstrndx][4] if raw and e_shstrndx < len(raw) else None
        self.sections = []
        for i, (nm, typ, flags, addr, off, size, link, info, align, entsz) in enumerate(raw):
            name = self._cstr(names_off + nm) if names_off is not None else ""
            self.sections.append(Section(name, addr, size, off, typ, flags, i))
        self._raw_sections = raw
        self._sec_by_name = {}
        for s in self.sections:
            self._sec_by_name.setdefault(s.name, s)

        self._dynsym_names: list[str] = []

        def tables():       # symbols and PLT entries: kept on disk per file (elfcache.py)
            self.symbols = self._parse_symbols()
            return self.symbols, self._name_irelative(
                _plt.find_plt_entries(self.sections, self.read, self._got_names()))
        if self.path is not None:
            from .elfcache import tables_of
            self.symbols, entries = tables_of(self, tables, Symbol)
        else:
            self.symbols, entries = tables()
        self.stripped = not any(s.type == SHT_SYMTAB for s in self.sections)
        self.has_debug_info = ".debug_info" in self._sec_by_name

        # PIE: DF_1_PIE, or (old linkers) an interpreter and no DT_SONAME;
        # libc.so.6 has PT_INTERP too, but a SONAME and no DF_1_PIE
        flags1, has_soname = self._dynamic_info()
        has_interp = any(s.type == PT_INTERP for s in self.segments)
        self.is_pie = self.elf_type == "DYN" and (
            bool(flags1 & DF_1_PIE) if flags1 else (has_interp and not has_soname)
        )
        self.is_shared = self.elf_type == "DYN" and not self.is_pie

        self.plt = {}
        for name, addr, _ in entries:
            self.plt.setdefault(name, addr)
        self.plt_symbols = [Symbol(name, addr, size, "PLT", "LOCAL") for name, addr, size in entries]

    def _cstr(self, off: int) -> str:
        d = self._data
        end = d.find(b"\0", off)
        if end < 0:
            raise ValueError("unterminated string")
        return d[off:end].decode("utf-8", "replace")

    def _parse_symbols(self) -> list[Symbol]:
        d = self._data
        raw = self._raw_sections
        found: dict[tuple[str, int], Symbol] = {}
        tables = [s for s in self.sections if s.type == SHT_SYMTAB] + [
            s for s in self.sections if s.type == SHT_DYNSYM
        ]
        for sec in tables:
            dynamic = sec.type == SHT_DYNSYM
            link = raw[sec.index][6]
            str_off, str_size = raw[link][4], raw[link][5]
            strtab = d[str_off:str_off + str_size]
            end = sec.offset + (sec.size // _SYM.size) * _SYM.size
            names = []
            for st_name, info, _other, shndx, value, size in _SYM.iter_unpack(d[sec.offset:end]):
                z = strtab.find(b"\0", st_name)
                name = strtab[st_name:z if z >= 0 else len(strtab)].decode("utf-8", "replace")
                if "@" in name and name[0] != "@":  # "stdout@GLIBC_2.2.5" (copy reloc)
                    name = name.split("@", 1)[0]
                if dynamic:
                    names.append(name)
                kind = _KINDS.get(info & 0xF)
                if (kind is None or not name or shndx == SHN_UNDEF
                        or (shndx >= SHN_LORESERVE and shndx != SHN_COMMON)):
                    continue
                key = (name, value)
                old = found.get(key)
                if old is None:
                    found[key] = Symbol(name, value, size, kind,
                                        _BINDINGS.get(info >> 4, "LOCAL"), shndx, dynamic)
                elif dynamic and not old.dynamic:
                    found[key] = replace(old, dynamic=True)
            if dynamic:
                self._dynsym_names = names
        return list(found.values())

    def _dynamic_info(self) -> tuple[int | None, bool]:
        """(DT_FLAGS_1 or None when absent, has DT_SONAME)."""
        flags1, soname = None, False
        for seg in self.segments:
            if seg.type != PT_DYNAMIC:
                continue
            off = seg.offset
            for _ in range(seg.filesz // _DYN.size):
                tag, val = _DYN.unpack_from(self._data, off)
                if tag == 0:
                    break
                if tag == DT_FLAGS_1:
                    flags1 = val
                elif tag == DT_SONAME:
                    soname = True
                off += _DYN.size
        return flags1, soname

    def _got_names(self) -> dict[int, str]:
        """GOT slot address -> symbol name, from JUMP_SLOT/GLOB_DAT relocations.

        IRELATIVE slots (calls inside libc to its own IFUNCs) are named
        ``*ABS*+0x<resolver>`` like objdump does; ``_name_irelative`` renames
        them afterwards.
        """
        out: dict[int, str] = {}
        raw = self._raw_sections
        for sec in self.sections:
            if sec.type != SHT_RELA or not sec.is_alloc:
                continue
            link = raw[sec.index][6]
            names = self._dynsym_names
            if link and (link >= len(self.sections) or self.sections[link].type != SHT_DYNSYM):
                continue
            end = sec.offset + (sec.size // _RELA.size) * _RELA.size
            for r_offset, r_info, addend in _RELA.iter_unpack(self._data[sec.offset:end]):
                rtype = r_info & 0xFFFFFFFF
                if rtype in (R_X86_64_JUMP_SLOT, R_X86_64_GLOB_DAT):
                    idx = r_info >> 32
                    if 0 < idx < len(names) and names[idx]:
                        out.setdefault(r_offset, names[idx])
                elif rtype == R_X86_64_IRELATIVE:
                    out.setdefault(r_offset, f"{_ABS_PREFIX}{addend:#x}")
        return out

    def _name_irelative(self, entries: list) -> list:
        """Rename ``*ABS*+0xR@plt`` to ``f@plt`` when f is the IFUNC whose
        resolver is R and no JUMP_SLOT stub is called ``f@plt``."""
        if not any(e[0].startswith(_ABS_PREFIX) for e in entries):
            return entries
        ifuncs: dict[int, str] = {}
        for sym in sorted((x for x in self.symbols if x.kind == "IFUNC"), key=_symbol_rank):
            ifuncs.setdefault(sym.address, sym.name)
        taken = {e[0] for e in entries if not e[0].startswith(_ABS_PREFIX)}
        out = []
        for name, addr, size in entries:
            if name.startswith(_ABS_PREFIX):
                f = ifuncs.get(int(name[len(_ABS_PREFIX):-4], 16))
                if f is not None and f"{f}@plt" not in taken:
                    name = f"{f}@plt"
            out.append((name, addr, size))
        return out

    # ---------------------------------------------------------------- queries
    def __repr__(self) -> str:
        return (f"<ElfImage {self.name} {self.elf_type}{' PIE' if self.is_pie else ''} "
                f"{len(self.symbols)} symbols{' stripped' if self.stripped else ''}>")

    def read(self, offset: int, size: int) -> bytes:
        """File bytes at *offset* (used for section contents)."""
        return bytes(self._data[offset:offset + size])

    def section(self, name: str) -> Section | None:
        return self._sec_by_name.get(name)

    def section_at(self, addr: int) -> Section | None:
        """The allocated, non-TLS section containing relative address *addr*."""
        for s in self.sections:
            if s.is_alloc and not s.is_tls and s.size and s.address <= addr < s.address + s.size:
                return s
        return None

    def functions(self) -> list[Symbol]:
        return [s for s in self.symbols if s.kind in ("FUNC", "IFUNC")]

    def symbols_named(self, name: str) -> list[Symbol]:
        """All symbols (including ``x@plt`` entries) called *name*, best first."""
        if self._by_name is None:
            by: dict[str, list[Symbol]] = {}
            for s in self.symbols:
                by.setdefault(s.name, []).append(s)
            for s in self.plt_symbols:
                by.setdefault(s.name, []).append(s)
            for lst in by.values():
                if len(lst) > 1:
                    lst.sort(key=_symbol_rank)
            self._by_name = by
        return self._by_name.get(name, [])

    def all_names(self):
        self.symbols_named("")
        return self._by_name.keys()

    def _build_addr_index(self):
        best: dict[int, Symbol] = {}
        for s in self.symbols + self.plt_symbols:
            if s.kind not in ADDRESS_KINDS or s.address == 0:
                continue
            old = best.get(s.address)
            if old is None or _symbol_rank(s) < _symbol_rank(old):
                best[s.address] = s
        starts = sorted(best)
        self._addr_index = (starts, [best[a] for a in starts])

    def symbol_at(self, addr: int) -> Symbol | None:
        """The symbol containing relative address *addr* (bisect, O(log n)).

        A sized symbol contains [address, address+size); an unsized one
        (NOTYPE labels) only its own address.  When the nearest preceding
        symbol does not contain *addr*, a few earlier ones are tried so that
        a small symbol nested in a bigger one does not hide it.
        """
        if self._addr_index is None:
            self._build_addr_index()
        starts, syms = self._addr_index
        i = bisect.bisect_right(starts, addr) - 1
        for j in range(i, max(i - 4, -1), -1):
            if syms[j].contains(addr):
                return syms[j]
        return None

    def load_bias(self, mapping_start: int, mapping_offset: int) -> int | None:
        """Bias of a mapping of this file at *mapping_start* from *mapping_offset*.

        bias = start - page_down(p_vaddr) of the PT_LOAD whose page-aligned
        p_offset equals the mapping's file offset.  None if no PT_LOAD matches.
        """
        for seg in self.loads:
            if (seg.offset & ~0xFFF) == mapping_offset:
                return mapping_start - (seg.vaddr & ~0xFFF)
        return None

    def load_end(self) -> int:
        """Relative end (page-aligned up) of the last PT_LOAD."""
        if not self.loads:
            return 0
        return (max(s.vaddr + s.memsz for s in self.loads) + 0xFFF) & ~0xFFF

    # ------------------------------------------------------------------ DWARF
    def _dwarf_stream(self):
        if self.path is not None:
            return open(self.path, "rb")
        return io.BytesIO(self._data)

    def variables(self):
        """DWARF global and static variables (list of ``dwarf_vars.Variable``).

        Parsed on first call only; empty when there is no debug info.
        """
        if self._variables is None:
            if not self.has_debug_info:
                self._variables = []
            else:
                from .dwarf_cache import dwarf_of   # once per binary, cached on disk

                self._variables = dwarf_of(self).variables
        return self._variables

    @property
    def variables_read(self) -> list | None:
        """The DWARF variables if they were read already (None: not yet)."""
        return self._variables

    def variable_at(self, addr: int):
        """The DWARF variable containing relative address *addr*, or None."""
        if self._var_index is None:
            vs = sorted((v for v in self.variables() if v.address), key=lambda v: v.address)
            self._var_index = ([v.address for v in vs], vs)
        starts, vs = self._var_index
        i = bisect.bisect_right(starts, addr) - 1
        for j in range(i, max(i - 4, -1), -1):
            v = vs[j]
            if v.address <= addr < v.address + max(v.size, 1):
                return v
        return None

    def variables_named(self, name: str):
        return [v for v in self.variables() if v.name == name]
