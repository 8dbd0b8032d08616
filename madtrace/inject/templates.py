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
from dataclasses import dataclass
from functools import lru_cache

from ..errors import TracerInternalError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_PATH = os.path.join(ROOT, "build", "injector", "templates.json")


@dataclass(frozen=True)
class Template:
    name: str
    code: bytes
    patch_points: dict[str, tuple[tuple[int, str], ...]]
    marks: dict[str, int] = None     # mt_<name>_at_<mark>: offset in the template

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
        for field, points in self.patch_points.items():
            value = fields[field]
            for offset, kind in points:
                if kind == "abs64":
                    struct.pack_into("<Q", code, offset, value)
                elif kind == "imm32":
                    struct.pack_into("<i", code, offset, value)
                else:  # rel32
                    rel = value - (address + offset + 4)
                    if not -(1 << 31) <= rel < (1 << 31):
                        raise TracerInternalError(f"template {self.name}: {field} out of rel32 range")
                    struct.pack_into("<i", code, offset, rel)
        return code


class Injector:
    """The built injector: ``layout`` constants and ``templates`` by name."""

    def __init__(self, data: dict):
        self.layout: dict[str, int] = data["layout"]
        self.templates: dict[str, Template] = {
            name: Template(name, bytes.fromhex(t["code"]),
                           {f: tuple((o, k) for o, k in pp) for f, pp in t["patch_points"].items()},
                           dict(t.get("marks", {})))
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
            f"the injector is not built ({path} is missing): run `make injector`") from None
