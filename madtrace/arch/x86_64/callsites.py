# SPDX-License-Identifier: GPL-2.0-or-later
"""Direct call sites of an ELF image, for the call-site trampoline engine.

API
---
``find_call_sites(image, code_reader=None, targets=None) -> CallSiteScan``
    Every direct ``call rel32`` (``E8``) and ``jmp rel32`` (``E9``, a tail
    call) in the image's executable sections (not ``.plt*``) whose target is
    a *function start*: the address of a FUNC/IFUNC symbol of the image or of
    a PLT stub (``malloc@plt``).  In a stripped image (no ``.symtab``) the
    targets of direct ``call rel32`` instructions count as function starts
    too.  *targets* (a set of relative addresses) restricts the result to
    transfers to those addresses.  *code_reader(rel_addr, size) -> bytes*
    reads code (e.g. from the tracee's memory); default: the ELF file.
    All addresses are ELF-relative (add the module bias).
``CallSite(address, kind, target, caller, prefix_len=0)``
    ``kind`` is ``"call"`` or ``"jmp"``; ``address`` is where the 5 bytes
    ``E8/E9 rel32`` are, i.e. the instruction start plus ``prefix_len``
    harmless prefix bytes (``bnd`` F2, hints 2E/3E, REX) that may stay in
    front of a patched ``jmp``; ``caller`` is the containing function's name
    or None.  ``insn_address`` = ``address - prefix_len``; ``return_address``
    = ``address + 5``.
``UnpatchableSite(address, kind, target, caller, size, reason)``
    Direct transfers to a function start that cannot be replaced by a 5-byte
    ``jmp``: ``jmp rel8`` (kind ``"jmp8"``), conditional tail calls
    (``"jcc"``, rel8 or the 6-byte rel32 form, which could be retargeted),
    ``loop``/``jrcxz`` (``"jcc"``), call/jmp with another prefix (``66``,
    segment).  ``address`` is the instruction start.  Indirect calls/jumps are
    never listed: functions reachable through them must be entry-patched (see
    ``address_taken``).
``CallSiteScan``: ``sites``, ``unpatchable``, ``function_starts``
    (frozenset), ``instructions`` (number decoded), ``sections`` (names),
    ``by_target()``, ``sites_to(target)``, ``branch_targets``/``branch_sources`` (every direct
    branch of the code, sorted by target) and ``branches_into(lo, hi)``
    (``[(source, target)]`` with ``lo < target < hi``) -- pass
    ``lambda lo, hi: scan.branches_into(lo - bias, hi - bias)`` to
    ``relocate_entry`` to check every branch of the image, not only the
    function's own, into a relocated prologue (and to skip its sweep).
``address_taken(image, code_reader=None) -> set[int]``
    A conservative superset of the function starts (FUNC/IFUNC symbols and
    PLT stubs) that may be called indirectly: targets of ``lea r,[rip+X]``
    (byte-pattern scan of the code, no decoding), data relocations
    (``R_X86_64_RELATIVE``/``IRELATIVE`` addends, ``R_X86_64_64``/
    ``GLOB_DAT``/``JUMP_SLOT`` symbol values), ``.init_array``/
    ``.fini_array``/``.preinit_array`` entries, ``DT_INIT``/``DT_FINI``, the
    entry point, exported (GLOBAL/WEAK/UNIQUE ``.dynsym``) functions, and for
    non-PIE executables any 32-bit window of code or data equal to a function
    start (absolute immediates / pointers need no relocation there).  In a
    stripped image every such address inside an executable section counts
    (local functions have no symbol); non-PIE windows are then limited to
    ``mov``/``push`` immediates and 8-aligned data words.

Method (speed matters: libpython3.11's 2.3 MB ``.text`` is scanned in about
0.3 s): each executable section is swept linearly with capstone's C decoder
(``decode.sweep``), restarting at every symbol whose address the sweep did
not land on -- objdump's behaviour, so the instruction boundaries are the
same as ``objdump -d``'s; the branch instructions are then picked out and
their targets computed with numpy from the raw bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from madtrace.binary.elf import (
    SHF_ALLOC,
    SHF_EXECINSTR,
    SHT_DYNSYM,
    SHT_NOBITS,
    SHT_RELA,
    _symbol_rank,
)

from .decode import as_buffer, sweep

_HARMLESS_PREFIXES = frozenset([0xF2, 0x2E, 0x3E] + list(range(0x40, 0x50)))
_ALL_PREFIXES = _HARMLESS_PREFIXES | {0xF3, 0x66, 0x67, 0x26, 0x36, 0x64, 0x65, 0xF0}
_PAD = 16  # zero bytes appended to every code buffer so that gathers never overrun


@dataclass(frozen=True, slots=True)
class CallSite:
    address: int
    kind: str
    target: int
    caller: str | None
    prefix_len: int = 0

    @property
    def insn_address(self) -> int:
        return self.address - self.prefix_len

    @property
    def return_address(self) -> int:
        return self.address + 5


@dataclass(frozen=True, slots=True)
class UnpatchableSite:
    address: int
    kind: str
    target: int
    caller: str | None
    size: int
    reason: str


@dataclass
class CallSiteScan:
    sites: list[CallSite]
    unpatchable: list[UnpatchableSite]
    function_starts: frozenset
    instructions: int = 0
    sections: list[str] = field(default_factory=list)
    # every direct branch (call/jmp/jcc/loop, any target) of the swept code,
    # sorted by target: relative addresses
    branch_targets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    branch_sources: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def branches_into(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """(source, target) of the direct branches with ``lo < target < hi``
        (relative addresses); e.g. into a function's first bytes."""
        a, b = np.searchsorted(self.branch_targets, [lo + 1, hi])
        return list(zip(self.branch_sources[a:b].tolist(), self.branch_targets[a:b].tolist()))

    def by_target(self) -> dict[int, list[CallSite]]:
        out: dict[int, list[CallSite]] = {}
        for s in self.sites:
            out.setdefault(s.target, []).append(s)
        return out

    def sites_to(self, target: int) -> list[CallSite]:
        """The sites whose target is ``target``, in address order (the index is
        built at the first call)."""
        index = self.__dict__.get("_by_target")
        if index is None:
            index = self.__dict__["_by_target"] = self.by_target()
        return index.get(target, [])


# ------------------------------------------------------------------ helpers
def code_sections(image):
    """Executable, allocated sections with contents, except the PLT ones."""
    return [s for s in image.sections
            if s.flags & SHF_EXECINSTR and s.flags & SHF_ALLOC and s.type != SHT_NOBITS
            and s.size and not s.name.startswith(".plt")]


def _read_section(image, sec, code_reader):
    if code_reader is not None:
        data = code_reader(sec.address, sec.size)
    else:
        data = image.read(sec.offset, sec.size)
    buf = np.zeros(len(data) + _PAD, np.uint8)
    buf[:len(data)] = as_buffer(data)
    return buf, len(data)


def _i32(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    v = (buf[pos].astype(np.uint32) | (buf[pos + 1].astype(np.uint32) << 8)
         | (buf[pos + 2].astype(np.uint32) << 16) | (buf[pos + 3].astype(np.uint32) << 24))
    return v.view(np.int32).astype(np.int64)


def _i8(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return buf[pos].view(np.int8).astype(np.int64)


def _function_starts(image) -> np.ndarray:
    addrs = {s.address for s in image.symbols if s.kind in ("FUNC", "IFUNC") and s.address}
    addrs.update(s.address for s in image.plt_symbols)
    return np.array(sorted(addrs), dtype=np.int64)


class _FuncIndex:
    """Vectorized 'containing function' lookup."""

    def __init__(self, image):
        best: dict[int, object] = {}
        for s in image.symbols:
            if s.kind in ("FUNC", "IFUNC") and s.address and s.size:
                old = best.get(s.address)
                if old is None or _symbol_rank(s) < _symbol_rank(old):
                    best[s.address] = s
        syms = [best[a] for a in sorted(best)]
        self.starts = np.array([s.address for s in syms], dtype=np.int64)
        self.ends = np.array([s.address + s.size for s in syms], dtype=np.int64)
        self.names = [s.name for s in syms]

    def lookup(self, addrs: np.ndarray) -> list[str | None]:
        if not len(self.starts) or not len(addrs):
            return [None] * len(addrs)
        i = np.searchsorted(self.starts, addrs, side="right") - 1
        ok = (i >= 0) & (addrs < self.ends[np.maximum(i, 0)])
        names = self.names
        return [names[j] if k else None for j, k in zip(i.tolist(), ok.tolist())]


def _range_starts(image, sec) -> np.ndarray:
    """Where objdump restarts decoding in *sec*: its start and every symbol in it."""
    end = sec.address + sec.size
    starts = {sec.address}
    for s in image.symbols:
        if s.kind != "TLS" and s.section == sec.index and sec.address <= s.address < end:
            starts.add(s.address)
    return np.array(sorted(starts), dtype=np.int64) - sec.address


def sweep_section(image, sec, buf: np.ndarray, n: int):
    """Instruction (offsets, sizes) of a section, objdump-style (resync at symbols)."""
    offs, sizes = sweep(buf, sec.address, 0, n)
    rs = _range_starts(image, sec)
    unsynced = np.nonzero(~np.isin(rs, offs))[0]
    if not len(unsynced):
        return offs, sizes
    keep = np.ones(len(offs), bool)
    extra_o, extra_s = [], []
    for k in unsynced.tolist():
        lo = int(rs[k])
        hi = int(rs[k + 1]) if k + 1 < len(rs) else n
        a, b = np.searchsorted(offs, [lo, hi])
        keep[a:b] = False
        o2, s2 = sweep(buf, sec.address, lo, min(hi + 15, n))
        m = o2 < hi
        extra_o.append(o2[m])
        extra_s.append(s2[m])
    offs = np.concatenate([offs[keep]] + extra_o)
    sizes = np.concatenate([sizes[keep]] + extra_s)
    order = np.argsort(offs, kind="stable")
    return offs[order], sizes[order]


def _branches(buf, offs, sizes):
    """Direct relative branches among decoded instructions.

    Returns (offset, prefix_len, kind, size, target_offset_from_section) arrays
    where kind: 0 call32, 1 jmp32, 2 jmp8, 3 jcc8, 4 jcc32, 5 loop/jrcxz.
    """
    b0 = buf[offs]
    b1 = buf[offs + 1]
    res_o, res_p, res_k, res_s, res_t = [], [], [], [], []

    def add(mask, kind, disp_at, disp_fn, prefix=0):
        o = offs[mask]
        s = sizes[mask]
        res_o.append(o)
        res_p.append(np.full(len(o), prefix, np.int64) if np.isscalar(prefix) else prefix)
        res_k.append(np.full(len(o), kind, np.int64))
        res_s.append(s)
        res_t.append(o + s + disp_fn(buf, o + disp_at))

    add((b0 == 0xE8) & (sizes == 5), 0, 1, _i32)
    add((b0 == 0xE9) & (sizes == 5), 1, 1, _i32)
    add((b0 == 0xEB) & (sizes == 2), 2, 1, _i8)
    add((b0 >= 0x70) & (b0 <= 0x7F) & (sizes == 2), 3, 1, _i8)
    add((b0 == 0x0F) & ((b1 & 0xF0) == 0x80) & (sizes == 6), 4, 2, _i32)
    add((b0 >= 0xE0) & (b0 <= 0xE3) & (sizes == 2), 5, 1, _i8)

    # prefixed forms (bnd jmp, rex call, ...): a few, checked one by one
    is_pfx = np.zeros(256, bool)
    is_pfx[list(_ALL_PREFIXES)] = True
    cand = np.nonzero(is_pfx[b0] & (sizes >= 3) & (sizes <= 15))[0]
    if len(cand):
        tail5 = buf[offs[cand] + sizes[cand] - 5]
        tail6 = buf[offs[cand] + sizes[cand] - 6]
        tail6b = buf[offs[cand] + sizes[cand] - 5]
        tail2 = buf[offs[cand] + sizes[cand] - 2]
        sel = cand[(tail5 == 0xE8) | (tail5 == 0xE9) | ((tail6 == 0x0F) & ((tail6b & 0xF0) == 0x80))
                   | (tail2 == 0xEB) | ((tail2 >= 0x70) & (tail2 <= 0x7F))]
        for i in sel.tolist():
            o, s = int(offs[i]), int(sizes[i])
            insn = bytes(buf[o:o + s])
            for op_len, kind, dlen in ((5, None, 4), (6, 4, 4), (2, None, 1)):
                p = s - op_len
                if p < 1 or not all(c in _ALL_PREFIXES for c in insn[:p]):
                    continue
                op = insn[p]
                if op_len == 5 and op in (0xE8, 0xE9):
                    k = 0 if op == 0xE8 else 1
                elif op_len == 6 and op == 0x0F and insn[p + 1] & 0xF0 == 0x80:
                    k = 4
                elif op_len == 2 and op == 0xEB:
                    k = 2
                elif op_len == 2 and 0x70 <= op <= 0x7F:
                    k = 3
                else:
                    continue
                disp = int.from_bytes(insn[s - dlen:], "little", signed=True)
                res_o.append(np.array([o]))
                # prefix_len < 0 marks a prefix that must not stay in front of a jmp
                harmless = all(c in _HARMLESS_PREFIXES for c in insn[:p])
                res_p.append(np.array([p if harmless else -p]))
                res_k.append(np.array([k]))
                res_s.append(np.array([s]))
                res_t.append(np.array([o + s + disp]))
                break
    cat = lambda xs: np.concatenate(xs).astype(np.int64)  # noqa: E731
    return cat(res_o), cat(res_p), cat(res_k), cat(res_s), cat(res_t)


_JCC_REASON = {3: "conditional tail call (jcc rel8)",
               4: "conditional tail call (jcc rel32, 6 bytes: retarget instead of patch)",
               5: "loop/jrcxz to a function start"}


# --------------------------------------------------------------- main entry
def find_call_sites(image, code_reader=None, targets=None) -> CallSiteScan:
    """See the module docstring."""
    starts = _function_starts(image)
    secs = code_sections(image)
    decoded = []
    ninsn = 0
    for sec in secs:
        buf, n = _read_section(image, sec, code_reader)
        offs, sizes = sweep_section(image, sec, buf, n)
        ninsn += len(offs)
        decoded.append((sec, _branches(buf, offs, sizes)))

    if image.stripped:  # direct call targets in code are function starts too
        extra = [sec.address + t for sec, (o, p, k, s, t) in decoded
                 for t in [t[(k == 0) & (p >= 0)]]]
        if extra:
            ex = np.concatenate(extra)
            inside = np.zeros(len(ex), bool)
            for sec in secs:
                inside |= (ex >= sec.address) & (ex < sec.address + sec.size)
            starts = np.union1d(starts, ex[inside])
    want = starts
    if targets is not None:
        want = np.intersect1d(starts, np.array(sorted(targets), dtype=np.int64))

    all_t = [sec.address + t for sec, (o, p, k, s, t) in decoded]
    all_s = [sec.address + o for sec, (o, p, k, s, t) in decoded]
    all_t = np.concatenate(all_t) if all_t else np.zeros(0, np.int64)
    all_s = np.concatenate(all_s) if all_s else np.zeros(0, np.int64)
    order = np.argsort(all_t, kind="stable")
    all_t, all_s = all_t[order], all_s[order]

    findex = _FuncIndex(image)
    sites: list[CallSite] = []
    bad: list[UnpatchableSite] = []
    for sec, (o, p, k, s, t) in decoded:
        base = sec.address
        tgt = t + base
        m = np.isin(tgt, want)
        if not m.any():
            continue
        o, p, k, s, tgt = o[m] + base, p[m], k[m], s[m], tgt[m]
        order = np.argsort(o, kind="stable")
        o, p, k, s, tgt = o[order], p[order], k[order], s[order], tgt[order]
        callers = findex.lookup(o)
        for addr, pl, kind, size, target, caller in zip(o.tolist(), p.tolist(), k.tolist(),
                                                         s.tolist(), tgt.tolist(), callers):
            if kind <= 1 and pl >= 0:
                sites.append(CallSite(addr + pl, "call" if kind == 0 else "jmp",
                                      target, caller, pl))
            elif kind <= 1:
                bad.append(UnpatchableSite(addr, "call" if kind == 0 else "jmp", target, caller,
                                           size, f"{-pl} prefix byte(s) that change a branch"))
            elif kind == 2:
                bad.append(UnpatchableSite(addr, "jmp8", target, caller, size,
                                           "tail call by jmp rel8 (2 bytes, too short to patch)"))
            else:
                bad.append(UnpatchableSite(addr, "jcc", target, caller, size, _JCC_REASON[kind]))
    return CallSiteScan(sites, bad, frozenset(starts.tolist()), ninsn, [s.name for s in secs],
                        all_t, all_s)


# ------------------------------------------------------------ address taken
_RELA_DT = np.dtype([("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")])
_SYM_DT = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                    ("value", "<u8"), ("size", "<u8")])
R_64, R_GLOB_DAT, R_JUMP_SLOT, R_RELATIVE, R_IRELATIVE = 1, 6, 7, 8, 37
DT_INIT, DT_FINI = 12, 13


def _dynamic_entries(image):
    out = {}
    for seg in image.segments:
        if seg.type != 2:  # PT_DYNAMIC
            continue
        raw = image.read(seg.offset, seg.filesz)
        for tag, val in struct.iter_unpack("<qQ", raw[:len(raw) // 16 * 16]):
            if tag == 0:
                break
            out.setdefault(tag, val)
    return out


def address_taken(image, code_reader=None) -> set[int]:
    """See the module docstring."""
    starts = _function_starts(image)
    found: list[np.ndarray] = []
    absolute = image.elf_type == "EXEC"
    stripped = image.stripped

    # code: lea r32/r64, [rip+disp32]  (8D, modrm mod=00 rm=101), any REX
    for sec in code_sections(image):
        buf, n = _read_section(image, sec, code_reader)
        pos = np.nonzero((buf[:n] == 0x8D) & ((buf[1:n + 1] & 0xC7) == 0x05))[0]
        found.append(sec.address + pos + 6 + _i32(buf, pos + 2))
        if absolute and n >= 4:
            allpos = np.arange(n - 3)
            if stripped:  # only after mov r32,imm32 / push imm32 / mov r/m,imm32 opcodes
                prev = buf[np.maximum(allpos - 1, 0)]
                prev2 = buf[np.maximum(allpos - 2, 0)]
                allpos = allpos[((prev >= 0xB8) & (prev <= 0xBF)) | (prev == 0x68)
                                | ((prev2 == 0xC7) & (prev & 0xC0 == 0xC0))]
            found.append(_i32(buf, allpos) & 0xFFFFFFFF)

    # data: relocations, init/fini arrays, (non-PIE) raw pointers
    dynsym_values = None
    for sec in image.sections:
        if sec.type == SHT_DYNSYM and dynsym_values is None:
            raw = image.read(sec.offset, sec.size // _SYM_DT.itemsize * _SYM_DT.itemsize)
            dynsym_values = np.frombuffer(raw, _SYM_DT)["value"].astype(np.int64)
    for sec in image.sections:
        if sec.type == SHT_RELA and sec.flags & SHF_ALLOC:
            raw = image.read(sec.offset, sec.size // _RELA_DT.itemsize * _RELA_DT.itemsize)
            rel = np.frombuffer(raw, _RELA_DT)
            rtype = (rel["info"] & 0xFFFFFFFF).astype(np.int64)
            rsym = (rel["info"] >> np.uint64(32)).astype(np.int64)
            add = rel["addend"].astype(np.int64)
            found.append(add[(rtype == R_RELATIVE) | (rtype == R_IRELATIVE)])
            if dynsym_values is not None:
                m = np.isin(rtype, [R_64, R_GLOB_DAT, R_JUMP_SLOT]) & (rsym < len(dynsym_values))
                found.append(dynsym_values[rsym[m]] + np.where(rtype[m] == R_64, add[m], 0))
        elif sec.flags & SHF_ALLOC and sec.type != SHT_NOBITS and not sec.flags & SHF_EXECINSTR:
            if sec.name in (".init_array", ".fini_array", ".preinit_array"):
                raw = image.read(sec.offset, sec.size // 8 * 8)
                found.append(np.frombuffer(raw, "<u8").astype(np.int64))
            elif absolute and sec.size >= 4:
                raw = as_buffer(image.read(sec.offset, sec.size))
                pos = np.arange(0, len(raw) - 3, 8 if stripped else 1)
                found.append(_i32(np.concatenate([raw, np.zeros(4, np.uint8)]), pos) & 0xFFFFFFFF)

    dyn = _dynamic_entries(image)
    misc = [image.entry] + [dyn[t] for t in (DT_INIT, DT_FINI) if t in dyn]
    misc += [s.address for s in image.symbols
             if s.dynamic and s.kind in ("FUNC", "IFUNC") and s.binding in ("GLOBAL", "WEAK", "UNIQUE")]
    found.append(np.array(misc, dtype=np.int64))

    allv = np.concatenate(found) if found else np.zeros(0, np.int64)
    if stripped:
        # local functions have no symbol: any taken address in the code counts
        code = np.zeros(len(allv), bool)
        for sec in image.sections:
            if sec.flags & SHF_EXECINSTR and sec.flags & SHF_ALLOC and sec.size:
                code |= (allv >= sec.address) & (allv < sec.address + sec.size)
        starts = np.union1d(starts, allv[code])
    hit = np.intersect1d(allv, starts)
    return set(hit.tolist())
