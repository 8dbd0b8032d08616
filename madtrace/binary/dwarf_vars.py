# SPDX-License-Identifier: GPL-2.0-or-later
"""DWARF global and static variables, with enough type information to name
the field or element an address falls in.

API
---
``TypeInfo`` (mutable, may be cyclic through pointers): ``kind`` (``base``
    ``pointer`` ``array`` ``struct`` ``union`` ``class`` ``enum``
    ``typedef`` ``const`` ``volatile`` ``restrict`` ``atomic`` ``function``
    ``void`` ``unknown``), ``name`` (C spelling: ``int``, ``char *``,
    ``struct config``, ``int[3][4]``, ``const char[15]``), ``size``,
    ``target`` (element type of arrays; aliased type of typedef/cv;
    pointee of pointers), ``count`` (array element count, None when
    unknown), ``members`` (list of ``Member`` for struct/union/class).
    ``strip()`` follows typedef and cv qualifiers.
``Member`` (frozen): ``name`` (None for anonymous members), ``offset``,
    ``size``, ``type``.
``Variable`` (frozen): ``name``, ``address`` (relative to the ELF), ``size``,
    ``type`` (``TypeInfo`` or None), ``type_name``, ``scope`` (function name
    for static locals, None for file-scope variables), ``external`` (True for
    non-static globals), ``cu`` (compilation unit name).
``load_variables(stream, name="") -> list[Variable]``
    All ``DW_TAG_variable`` DIEs with a ``DW_OP_addr`` location (including
    static locals and definitions that point at a declaration through
    ``DW_AT_specification``), deduplicated on name+address.  Corrupt DWARF
    yields the variables read so far (never a traceback).
``describe_in_variable(var, offset) -> str``
    ``counters[3]``, ``config.name+2``, ``points[2].y``; the remainder that
    does not reach a deeper field or element is appended in decimal bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DW_OP_addr = 0x03
_STRUCTS = {"DW_TAG_structure_type": "struct", "DW_TAG_union_type": "union",
            "DW_TAG_class_type": "class"}
_QUALIFIERS = {"DW_TAG_const_type": "const", "DW_TAG_volatile_type": "volatile",
               "DW_TAG_restrict_type": "restrict", "DW_TAG_atomic_type": "atomic"}
_TRANSPARENT = frozenset(("typedef", "const", "volatile", "restrict", "atomic"))


@dataclass(eq=False)
class TypeInfo:
    kind: str
    name: str
    size: int = 0
    target: "TypeInfo | None" = None
    count: int | None = None
    members: list = field(default_factory=list)

    def strip(self) -> "TypeInfo":
        t = self
        seen = 0
        while t.kind in _TRANSPARENT and t.target is not None and seen < 64:
            t = t.target
            seen += 1
        return t

    def __repr__(self) -> str:
        return f"<TypeInfo {self.kind} {self.name!r} size={self.size}>"


@dataclass(frozen=True, slots=True)
class Member:
    name: str | None
    offset: int
    size: int
    type: TypeInfo | None


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    address: int
    size: int
    type: TypeInfo | None = None
    type_name: str = "?"
    scope: str | None = None
    external: bool = False
    cu: str = ""


UNKNOWN = TypeInfo("unknown", "?", 0)
VOID = TypeInfo("void", "void", 0)


# The C spelling of each kind of type, shared by both readers of DWARF (this
# module's pyelftools walk and dwarf_native's records).  Types that can sit on
# a cycle (struct members, pointees, typedef and cv targets) are made in two
# steps: the shell first (cached by the caller), then linked to its target.
def struct_type(kind: str, name: str | None, size: int) -> TypeInfo:
    return TypeInfo(kind, f"{kind} {name}" if name else f"{kind} <anon>", size)


def enum_type(name: str | None, size: int) -> TypeInfo:
    return TypeInfo("enum", f"enum {name}" if name else "enum", size)


def link_pointer(t: TypeInfo, target: TypeInfo, reference: bool) -> TypeInfo:
    t.target = target
    if target.kind == "function":
        t.name = "void (*)()"
    else:
        t.name = target.name + (" &" if reference else " *")
    return t


def link_alias(t: TypeInfo, target: TypeInfo) -> TypeInfo:
    """A typedef (named already) or a cv qualifier (``t.kind``) of *target*."""
    t.target = target
    t.size = target.size
    if t.kind == "typedef":
        return t
    q, tn = t.kind, target.name
    if target.kind == "pointer":
        t.name = f"{tn} {q}"
    elif target.kind == "array" and tn.startswith(q + " "):
        t.name = tn  # const array of const char: "const char[15]"
    else:
        t.name = f"{q} {tn}"
    return t


def array_type(element: TypeInfo, dims: list[int | None], explicit: int | None) -> TypeInfo:
    """*element*[d0][d1]...; a None dimension is unknown (``[]``)."""
    t = element
    for count in reversed(dims or [None]):  # innermost dimension first
        dim = f"[{count}]" if count is not None else "[]"
        if t.kind == "array":
            base, _, rest = t.name.partition("[")
            name = f"{base}{dim}[{rest}"
        else:
            name = f"{t.name}{dim}"
        t = TypeInfo("array", name, t.size * count if count else 0, t, count)
    if explicit:
        t.size = explicit
    return t


def _attr_str(die, name):
    a = die.attributes.get(name)
    if a is None:
        return None
    v = a.value
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _attr_int(die, name):
    a = die.attributes.get(name)
    if a is None or not isinstance(a.value, int):
        return None
    return a.value


class _TypeResolver:
    def __init__(self):
        self._cache: dict[int, TypeInfo] = {}

    def of(self, die) -> TypeInfo:
        """TypeInfo of the DIE referenced by *die*'s DW_AT_type."""
        if "DW_AT_type" not in die.attributes:
            return VOID
        try:
            t = die.get_DIE_from_attribute("DW_AT_type")
        except Exception:  # noqa: BLE001 - bad reference in corrupt DWARF
            return UNKNOWN
        return self.resolve(t)

    def resolve(self, die) -> TypeInfo:
        key = die.offset
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        tag = die.tag
        name = _attr_str(die, "DW_AT_name")
        size = _attr_int(die, "DW_AT_byte_size")
        if tag in ("DW_TAG_base_type", "DW_TAG_unspecified_type"):
            t = TypeInfo("base", name or "?", size or 0)
        elif tag == "DW_TAG_enumeration_type":
            t = enum_type(name, size or 0)
        elif tag in _STRUCTS:
            t = struct_type(_STRUCTS[tag], name, size or 0)
            self._cache[key] = t  # before members: breaks cycles
            for child in die.iter_children():
                if child.tag != "DW_TAG_member":
                    continue
                mt = self.of(child)
                off = self._member_offset(child)
                msize = _attr_int(child, "DW_AT_byte_size") or mt.size
                t.members.append(Member(_attr_str(child, "DW_AT_name"), off, msize, mt))
            return t
        elif tag in ("DW_TAG_pointer_type", "DW_TAG_reference_type"):
            t = self._cache[key] = TypeInfo("pointer", "?", size or 8)
            return link_pointer(t, self.of(die), tag == "DW_TAG_reference_type")
        elif tag == "DW_TAG_typedef" or tag in _QUALIFIERS:
            t = self._cache[key] = TypeInfo(_QUALIFIERS.get(tag, "typedef"), name or "?", 0)
            return link_alias(t, self.of(die))
        elif tag == "DW_TAG_array_type":
            t = self._array(die)
        elif tag == "DW_TAG_subroutine_type":
            t = TypeInfo("function", "function", 0)
        else:
            t = TypeInfo("unknown", name or tag, size or 0)
        self._cache[key] = t
        return t

    @staticmethod
    def _member_offset(die) -> int:
        a = die.attributes.get("DW_AT_data_member_location")
        if a is not None:
            v = a.value
            if isinstance(v, int):
                return v
            if isinstance(v, (list, tuple)) and len(v) >= 2 and v[0] == 0x23:  # plus_uconst
                # ULEB128 operand
                result, shift = 0, 0
                for b in v[1:]:
                    result |= (b & 0x7F) << shift
                    shift += 7
                    if not b & 0x80:
                        break
                return result
            return 0
        bits = _attr_int(die, "DW_AT_data_bit_offset")
        return bits // 8 if bits is not None else 0

    def _array(self, die) -> TypeInfo:
        elem = self.of(die)
        dims: list[int | None] = []
        for child in die.iter_children():
            if child.tag not in ("DW_TAG_subrange_type", "DW_TAG_enumeration_type"):
                continue
            count = _attr_int(child, "DW_AT_count")
            if count is None:
                ub = _attr_int(child, "DW_AT_upper_bound")
                lb = _attr_int(child, "DW_AT_lower_bound") or 0
                count = ub - lb + 1 if ub is not None else None
            dims.append(count)
        return array_type(elem, dims, _attr_int(die, "DW_AT_byte_size"))


def _location_address(die) -> int | None:
    a = die.attributes.get("DW_AT_location")
    if a is None or a.form not in ("DW_FORM_exprloc", "DW_FORM_block1", "DW_FORM_block",
                                   "DW_FORM_block2", "DW_FORM_block4"):
        return None
    v = a.value
    if isinstance(v, (list, tuple, bytes)) and len(v) == 9 and v[0] == DW_OP_addr:
        return int.from_bytes(bytes(v[1:9]), "little")
    return None


def _origin(die):
    for attr in ("DW_AT_specification", "DW_AT_abstract_origin"):
        if attr in die.attributes:
            try:
                return die.get_DIE_from_attribute(attr)
            except Exception:  # noqa: BLE001
                return None
    return None


def load_variables(stream, name: str = "") -> list[Variable]:
    """Read the DWARF variables of the ELF file in *stream* (see module doc)."""
    from elftools.common.exceptions import ELFError, DWARFError
    from elftools.elf.elffile import ELFFile

    out: dict[tuple[str, int], Variable] = {}
    try:
        elf = ELFFile(stream)
        if not elf.has_dwarf_info():
            return []
        dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False)
        for cu in dwarf.iter_CUs():
            resolver = _TypeResolver()
            top = cu.get_top_DIE()
            cu_name = _attr_str(top, "DW_AT_name") or ""
            _collect(top, None, resolver, cu_name, out)
    except (ELFError, DWARFError, KeyError, IndexError, ValueError, AttributeError,
            AssertionError, TypeError) as e:
        # keep what was read; corrupt or unsupported debug info is not fatal
        import logging

        logging.getLogger(__name__).debug("DWARF of %s: %s", name, e)
    return list(out.values())


def _collect(parent, scope, resolver, cu_name, out) -> None:
    for die in parent.iter_children():
        tag = die.tag
        if tag == "DW_TAG_variable":
            addr = _location_address(die)
            if addr is None:
                continue
            src = die
            vname = _attr_str(die, "DW_AT_name")
            if vname is None or "DW_AT_type" not in die.attributes:
                origin = _origin(die)
                if origin is not None:
                    src = origin
                    vname = vname or _attr_str(origin, "DW_AT_name")
            if not vname:
                continue
            t = resolver.of(src)
            external = bool(die.attributes.get("DW_AT_external") or
                            (src is not die and src.attributes.get("DW_AT_external")))
            key = (vname, addr)
            if key not in out:
                out[key] = Variable(vname, addr, t.size, t, t.name, scope, external, cu_name)
        elif tag in ("DW_TAG_subprogram", "DW_TAG_lexical_block", "DW_TAG_namespace",
                     "DW_TAG_inlined_subroutine"):
            if not die.has_children:
                continue
            sub_scope = scope
            if tag == "DW_TAG_subprogram":
                sub_scope = _attr_str(die, "DW_AT_name")
                if sub_scope is None:
                    origin = _origin(die)
                    sub_scope = _attr_str(origin, "DW_AT_name") if origin is not None else scope
            _collect(die, sub_scope, resolver, cu_name, out)


def describe_in_variable(var: Variable, offset: int) -> str:
    """Name the element/field at byte *offset* of *var*: ``counters[3]``,
    ``config.name+2``, ``points[2].y``."""
    path = var.name
    t = var.type
    off = offset
    depth = 0
    while t is not None and off >= 0 and depth < 32:
        depth += 1
        t = t.strip()
        if t.kind == "array" and t.target is not None and t.target.size > 0:
            esize = t.target.size
            idx = off // esize
            if t.count is not None and idx >= t.count:
                break
            path += f"[{idx}]"
            off -= idx * esize
            t = t.target
            continue
        if t.kind in ("struct", "union", "class"):
            hit = None
            for m in t.members:
                if m.offset <= off < m.offset + max(m.size, 1):
                    hit = m
                    break
            if hit is None:
                break
            if hit.name:
                path += f".{hit.name}"
            off -= hit.offset
            t = hit.type
            continue
        break
    return path if off == 0 else f"{path}+{off}"
