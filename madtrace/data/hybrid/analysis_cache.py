# SPDX-License-Identifier: GPL-2.0-or-later
"""The copier's function analyses kept on disk, once per binary.

The hybrid engine's copier analyses each function it copies
(arch/x86_64/copy_analysis.py ``FunctionAnalysis``: its instructions, branch
and RIP-relative tables, memory instructions and probe plans, the pieces laid
end to end).  An analysis is a function of the function's bytes and of where
they are; python3 running a short script copies ~1 100 functions of its own
(non-PIE) image, whose analysis was a third of the tracer's time after the
copier cache of instruction entries (entry_cache.py).  This cache keeps whole
analyses at the addresses the image's ELF file gives (a position-independent
image lands elsewhere in each run: its analyses are moved by the module's
bias, an indirect jump stub's copy of the function's start with them; those
with a reason that names an address are kept for images at fixed addresses
only).

Where: beside the copier cache, one file per binary, ``<key>.mta``, in the
cache's container (cache/disk.py): ``MTANAL01``, a JSON
header (the analyser's version: a hash of the copier's source and of
capstone's and numpy's versions; the binary's path and build-id), the
payload: ``marshal`` of {"functions": {(start, end): the analysis as plain
values (``encode``)}, "tables": its memory instructions and probe plans, each
kept once}.  An analysis is used only when its bytes are the function's
bytes now.  A damaged file, another analyser's, or one not owned by the user
is not read (and is rebuilt); marshal runs no code.

``get(module, code, start, end)`` gives the kept analysis or None; ``put``
keeps a new one; ``save()`` writes the files that gained some (at the end of
data tracing, as the copier cache).
"""

from __future__ import annotations

import hashlib
import marshal
import os

import numpy as np

from ...arch.x86_64.copy_analysis import FunctionAnalysis
from ...arch.x86_64.copy_encode import REG, movabs
from ...arch.x86_64.insn_entries import ProbePlan
from ...arch.x86_64.memops import MemInstruction, _operand
from ...cache import disk
from .entry_cache import (_PLAN, CacheFormatError, analyser_version, read_if_changed, read_kept,
                          read_marshalled, stamp, write_marshalled)

MAGIC = b"MTANAL01"
FORMAT = 3
SUFFIX = ".mta"
# numpy columns of an analysis, stored as (dtype, bytes)
_ARRAYS = ("offset", "insn_size", "kind", "planned", "calls", "branch_index", "branch_target",
           "branch_field", "rip_index", "rip_field", "rip_target", "blob_at")
# plain values marshal keeps as they are
_PLAIN = ("code", "start", "end", "n", "has_stub", "mem_index", "whys", "rip_targets",
          "stub_index", "stub_fields", "stub_rip_target", "blob")
_DICTS = ("sides", "branch_fails", "size_fails", "rip_fails")


def version() -> str:
    return hashlib.sha256(f"{analyser_version()} numpy {np.__version__}".encode()).hexdigest()[:32]


def _fields(o) -> tuple:
    """A MemOperand's fields, in its order (memops ``_operand`` makes it again)."""
    return (o.base, o.index, o.scale, o.disp, o.segment, o.size, o.load, o.store)


class _Tables:
    """One file's memory instructions (at address 0) and probe plans, each kept
    once: an analysis refers to them by index (made into objects once per file)."""

    def __init__(self, stored: tuple = ((), ())):
        mems, plans = stored
        self.mems, self.plans = list(mems), list(plans)
        self.mem_index = {m: i for i, m in enumerate(self.mems)}
        self.plan_index = {p: i for i, p in enumerate(self.plans)}
        new = tuple.__new__
        self.mem_objects = [new(MemInstruction, (0, m[0], m[1], m[2],
                                                 tuple(_operand(*o) for o in m[3]), m[4], m[5]))
                            for m in self.mems]
        self.plan_objects = [ProbePlan(*p) for p in self.plans]

    def mem_ref(self, m: MemInstruction) -> int:
        key = (m.size, m.mnemonic, m.text, tuple(_fields(o) for o in m.operands), m.rep, m.atomic)
        i = self.mem_index.get(key)
        if i is None:
            i = self.mem_index[key] = len(self.mems)
            self.mems.append(key)
            self.mem_objects.append(m.at(0))
        return i

    def plan_ref(self, p: ProbePlan) -> int:
        key = tuple(getattr(p, name) for name in _PLAN)
        i = self.plan_index.get(key)
        if i is None:
            i = self.plan_index[key] = len(self.plans)
            self.plans.append(key)
            self.plan_objects.append(ProbePlan(*key))
        return i

    def stored(self) -> tuple:
        return tuple(self.mems), tuple(self.plans)


_SHIFTED_ARRAYS = ("branch_target", "rip_target")     # addresses: moved with the function


def movable(a: FunctionAnalysis) -> bool:
    """Whether the analysis is right wherever the function is once its addresses
    are moved: reasons hold addresses in their text (an indirect jump's stub
    holds the function's start in its code: ``_stubs_moved`` moves it)."""
    return not (a.branch_fails or a.size_fails or a.rip_fails)


def _stubs_moved(blob: bytes, blob_at, stub_index, old_start: int, new_start: int) -> bytes | None:
    """``blob`` with each indirect jump stub's ``movabs rcx, -start`` (jump_stubs.py)
    made for ``new_start`` instead of ``old_start``; None if a stub lacks it."""
    if not stub_index or old_start == new_start:
        return blob
    old = movabs(REG["rcx"], -old_start)
    new = movabs(REG["rcx"], -new_start)
    out = bytearray(blob)
    for i in stub_index:
        at = out.find(old, int(blob_at[i]), int(blob_at[i + 1]))
        if at < 0:
            return None
        out[at:at + len(new)] = new
    return bytes(out)


def _why_moved(why: str | None, plan: ProbePlan, old: int, new: int) -> str | None:
    if why is None or plan.check is None or old == new:
        return why
    return why.replace(f" at {old:#x}: ", f" at {new:#x}: ", 1)     # ProbePlan.why_at


def encode(a: FunctionAnalysis, tables: _Tables, delta: int = 0) -> tuple:
    """The analysis as plain values (marshal), its memory instructions and plans
    as indices into ``tables``, its addresses moved by ``delta`` (to where the
    image's ELF file puts them: minus the module's bias)."""
    d = a.__dict__
    columns = [d[k] + delta if k in _SHIFTED_ARRAYS else d[k] for k in _ARRAYS]
    arrays = tuple((column.dtype.str, column.tobytes()) for column in columns)
    blob = _stubs_moved(a.blob, a.blob_at, a.stub_index, a.start, a.start + delta)
    if blob is None:
        raise ValueError("a stub without its start")
    moved = dict(start=a.start + delta, end=a.end + delta, blob=blob,
                 rip_targets=[t + delta if t else 0 for t in a.rip_targets],
                 stub_rip_target=[t + delta if t else 0 for t in a.stub_rip_target],
                 whys=[_why_moved(w, p, m.address, m.address + delta)
                       for w, p, m in zip(a.whys, a.plans, a.mems)])
    plain = tuple(moved.get(k, d[k]) for k in _PLAIN)
    dicts = tuple(tuple((key + delta, v) if k == "sides" else (key, v) for key, v in d[k].items())
                  for k in _DICTS)
    mems = (tuple(m.address + delta for m in a.mems), tuple(tables.mem_ref(m) for m in a.mems))
    plans = tuple(tables.plan_ref(p) for p in a.plans)
    return arrays, plain, dicts, tuple(t + delta for t in a.targets), mems, plans


def decode(stored: tuple, tables: _Tables, delta: int = 0) -> FunctionAnalysis:
    """The analysis ``encode`` kept, its addresses moved by ``delta`` (plus the
    module's bias)."""
    arrays, plain, dicts, targets, (addresses, refs), plans = stored
    a = FunctionAnalysis.__new__(FunctionAnalysis)
    d = a.__dict__
    for k, (dtype, raw) in zip(_ARRAYS, arrays):
        column = np.frombuffer(raw, dtype=dtype)      # read-only: copies change their own
        d[k] = column + delta if k in _SHIFTED_ARRAYS and delta else column
    for k, v in zip(_PLAIN, plain):
        d[k] = v
    for k, items in zip(_DICTS, dicts):
        d[k] = {key + delta: v for key, v in items} if k == "sides" else dict(items)
    a.refusal = None
    a.entries = None            # made again if a reason needs an instruction's text
    a.start, a.end = a.start + delta, a.end + delta
    a.address = (a.offset + a.start).tolist()
    a.size = a.insn_size.tolist()
    a.targets = {t + delta for t in targets}
    new, objects = tuple.__new__, tables.mem_objects
    a.mems = [new(MemInstruction, (address + delta,) + objects[i][1:])
              for address, i in zip(addresses, refs)]
    a.plans = [tables.plan_objects[i] for i in plans]
    if delta:
        blob = _stubs_moved(a.blob, a.blob_at, a.stub_index, a.start - delta, a.start)
        if blob is None:
            raise ValueError("a stub without its start")
        a.blob = blob
        a.rip_targets = [t + delta if t else 0 for t in a.rip_targets]
        a.stub_rip_target = [t + delta if t else 0 for t in a.stub_rip_target]
        a.whys = [_why_moved(w, p, m.address - delta, m.address)
                  for w, p, m in zip(a.whys, a.plans, a.mems)]
    return a


def read_file(path: str) -> dict:
    stored = read_marshalled(path, MAGIC, FORMAT, version())
    if not isinstance(stored, dict) or set(stored) != {"functions", "tables"}:
        raise CacheFormatError("unexpected content")
    return stored


def write_file(path: str, stored: dict, image=None) -> None:
    write_marshalled(path, stored, MAGIC, FORMAT, version(),
                     {"functions": len(stored["functions"])}, image)


def list_entries() -> list[dict]:
    return disk.list_entries(SUFFIX, MAGIC, FORMAT)


def clear() -> tuple[int, int]:
    return disk.clear(SUFFIX)


# files the resident process read before forking a worker (daemon/resident.py
# ``warm_copier``), inherited by the worker: path -> (stamp, stored, tables)
_preloaded: dict[str, tuple] = {}


def preload(image) -> None:
    """Read ``image``'s file now (the resident process), unless read already and
    unchanged since."""
    got = read_if_changed(_preloaded, image, SUFFIX, read_file)
    if got is not None:
        path, now, stored = got
        _preloaded[path] = (now, stored, _Tables(stored["tables"]))


def _read(path: str) -> tuple[dict, _Tables, bool]:
    """The file's functions and tables, and whether they were preloaded (and the
    file has not changed since)."""
    kept = _preloaded.get(path)
    if kept is not None and kept[0] == stamp(path):
        return kept[1]["functions"], kept[2], True
    stored = read_file(path)
    return stored["functions"], _Tables(stored["tables"]), False


class AnalysisCache:
    def __init__(self, notify=None):
        self.notify = notify or (lambda message: disk.notify(message))
        # module name -> (module, file path, {(start, end): encoded}, tables, new keys)
        self._modules: dict[str, tuple] = {}
        self.stats = {"analyses from the cache": 0, "analyses cached": 0,
                      "analysis files read by the resident process": 0}

    def _of(self, module) -> tuple | None:
        entry = self._modules.get(module.name)
        if entry is None:
            path = disk.entry_path_of(module.image, SUFFIX)
            functions: dict = {}
            tables = _Tables()
            if path and os.path.exists(path):
                got, usable = read_kept(path, _read, self.notify, "analysis cache")
                if got is not None:
                    functions, tables, preloaded = got
                    self.stats["analysis files read by the resident process"] += preloaded
                if not usable:
                    path = None
            entry = self._modules[module.name] = (module, path, functions, tables, set())
        return entry if entry[1] else None

    def get(self, module, code: bytes, start: int, end: int) -> FunctionAnalysis | None:
        """The kept analysis of the function at [start, end) if its bytes are ``code``."""
        entry = self._of(module)
        if entry is None:
            return None
        bias = module.bias
        stored = entry[2].get((start - bias, end - bias))
        if stored is None or stored[1][0] != bytes(code[:end - start]):
            return None
        if bias and any(stored[2][1:]):
            return None         # kept from where it cannot move (``movable``)
        try:
            made = decode(stored, entry[3], bias)
        except ValueError:
            return None
        self.stats["analyses from the cache"] += 1
        return made

    def put(self, module, analysis: FunctionAnalysis) -> None:
        entry = self._of(module)
        bias = module.bias
        if entry is None or analysis.refusal is not None or (bias and not movable(analysis)):
            return
        key = (analysis.start - bias, analysis.end - bias)
        try:
            encoded = encode(analysis, entry[3], -bias)
            marshal.dumps(encoded)      # plain values only (a numpy scalar would not be)
        except ValueError:
            return
        entry[2][key] = encoded
        entry[4].add(key)
        self.stats["analyses cached"] += 1

    def save(self) -> None:
        for module, path, functions, tables, new in self._modules.values():
            if not path or not new:
                continue
            try:
                write_file(path, {"functions": functions, "tables": tables.stored()}, module.image)
            except OSError as exc:
                self.notify(f"analysis cache {path}: {exc.strerror}; not written")
            new.clear()
