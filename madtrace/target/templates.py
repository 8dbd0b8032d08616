"""Trampoline templates and the shared-memory layout, as built from injector/.

``make`` assembles injector/trampolines.S and extracts every template and its
patch points into build/injector/templates.json (injector/build_templates.py);
this module loads that file.  Nothing here duplicates a byte or an offset of
the injector: both sides use what the build produced from the one source.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from functools import lru_cache

from ..errors import TracerInternalError
from ..native import built, how_to_build

DEFAULT_PATH = built("injector", "templates.json")


@dataclass(frozen=True)
class Template:
    name: str
    code: bytes
    patch_points: dict[str, tuple[tuple[int, str], ...]]
    marks: dict[str, int] = field(default_factory=dict)   # mt_<name>_at_<mark>: offsets
    _fixed: tuple | None = field(default=None, compare=False, repr=False)   # (mask, masked bytes)

    @property
    def size(self) -> int:
        return len(self.code)

    def instantiate(self, address: int, **fields: int) -> bytearray:
        """The template's bytes for execution at ``address`` with every patch point
        filled: imm32 and abs64 fields take the value, rel32 fields the target
        address (made relative to the end of the field)."""
        missing = set(self.patch_points) - set(fields)
        if missing:
            raise TracerInternalError(f"template {self.name}: missing fields {sorted(missing)}")
        code = bytearray(self.code)
        for name, points in self.patch_points.items():
            value = fields[name]
            for offset, kind in points:
                if kind == "abs64":
                    struct.pack_into("<Q", code, offset, value)
                elif kind == "imm32":
                    struct.pack_into("<i", code, offset, value)
                else:  # rel32
                    rel = value - (address + offset + 4)
                    if not -(1 << 31) <= rel < (1 << 31):
                        raise TracerInternalError(f"template {self.name}: {name} out of rel32 range")
                    struct.pack_into("<i", code, offset, rel)
        return code

    def recognise(self, code: bytes, address: int) -> dict[str, int] | None:
        """The fields of an instance of this template at the start of ``code``
        (placed at ``address``), or None if those bytes are not one: every byte
        outside the patch points must be the template's (rr recognises its
        stubs the same way).  rel32 fields are given as the address they reach."""
        if len(code) < self.size:
            return None
        if self._fixed is None:
            mask = bytearray(b"\xff" * self.size)
            for points in self.patch_points.values():
                for offset, kind in points:
                    mask[offset:offset + (8 if kind == "abs64" else 4)] = bytes(8 if kind == "abs64" else 4)
            fixed = bytes(b & m for b, m in zip(self.code, mask))
            object.__setattr__(self, "_fixed", (bytes(mask), fixed))
        mask, fixed = self._fixed
        head = code[:self.size]
        if int.from_bytes(head, "little") & int.from_bytes(mask, "little") != \
                int.from_bytes(fixed, "little"):
            return None
        fields = {}
        for name, points in self.patch_points.items():
            offset, kind = points[0]
            if kind == "abs64":
                fields[name] = struct.unpack_from("<Q", head, offset)[0]
            elif kind == "imm32":
                fields[name] = struct.unpack_from("<i", head, offset)[0]
            else:
                fields[name] = address + offset + 4 + struct.unpack_from("<i", head, offset)[0]
        return fields


class Injector:
    """The built injector: ``layout`` constants and ``templates`` by name."""

    def __init__(self, data: dict):
        self.layout: dict[str, int] = data["layout"]
        self.templates: dict[str, Template] = {
            name: Template(name, bytes.fromhex(t["code"]),
                           {f: tuple((o, k) for o, k in pp) for f, pp in t["patch_points"].items()},
                           marks=dict(t.get("marks", {})))
            for name, t in data["templates"].items()
        }

    def __getattr__(self, name: str) -> int:
        # injector.MT_RING_HEAD etc.
        try:
            return self.__dict__["layout"][name]
        except KeyError:
            raise AttributeError(name) from None

    def template(self, kind: str, timestamps: bool) -> Template:
        return self.templates[f"{kind}_{'ts' if timestamps else 'nots'}"]


@lru_cache(maxsize=1)
def load_injector(path: str | None = None) -> Injector:
    path = path or os.environ.get("MADTRACE_INJECTOR", DEFAULT_PATH)
    try:
        with open(path) as f:
            return Injector(json.load(f))
    except FileNotFoundError:
        raise TracerInternalError(
            f"the injector is not built ({path} is missing): {how_to_build('injector')}") from None
