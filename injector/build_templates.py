# SPDX-License-Identifier: GPL-2.0-or-later
"""Build step of the injector: trampolines.o -> templates.json.

For every template mt_<name>_start..mt_<name>_end in the object file, store
its bytes, its patch points (labels mt_<name>_pp_<field>_<kind>, each
marking the END of an imm32/abs64/rel32 field) and its marks (labels
mt_<name>_at_<mark>: offsets the tracer needs to know).  The layout constants of
layout.h are copied in too, so the tracer reads one file.

usage: build_templates.py trampolines.o layout.h out.json
"""

import json
import re
import sys

from elftools.elf.elffile import ELFFile

FIELD_SIZES = {"imm32": 4, "abs64": 8, "rel32": 4}
LABEL = re.compile(r"^mt_(?P<name>[a-z_]+?)_(?P<what>start|end|at_(?P<mark>[a-z_]+)|"
                   r"pp_(?P<field>[a-z_]+)_(?P<kind>imm32|abs64|rel32))$")


def parse_layout(path: str) -> dict[str, int]:
    layout = {}
    for line in open(path):
        m = re.match(r"\s*#define\s+(MT_\w+)\s+(\S+)", line)
        if m:
            layout[m.group(1)] = int(m.group(2), 0)
    return layout


def main(obj_path: str, layout_path: str, out_path: str) -> None:
    with open(obj_path, "rb") as f:
        elf = ELFFile(f)
        text = elf.get_section_by_name(".text").data()
        labels = {}
        for sym in elf.get_section_by_name(".symtab").iter_symbols():
            if sym.name.startswith("mt_"):
                labels[sym.name] = sym["st_value"]
    templates: dict[str, dict] = {}
    for label, value in labels.items():
        m = LABEL.match(label)
        if not m:
            raise SystemExit(f"unexpected label {label}")
        t = templates.setdefault(m["name"], {"patch_points": {}, "marks": {}})
        if m["what"] in ("start", "end"):
            t[m["what"]] = value
        elif m["mark"]:
            t["marks"][m["mark"]] = value
        else:
            size = FIELD_SIZES[m["kind"]]
            t["patch_points"].setdefault(m["field"], []).append([value - size, m["kind"]])
    out = {"layout": parse_layout(layout_path), "templates": {}}
    for name, t in sorted(templates.items()):
        start, end = t["start"], t["end"]
        points = {field: [[off - start, kind] for off, kind in sorted(pp)]
                  for field, pp in t["patch_points"].items()}
        out["templates"][name] = {"code": text[start:end].hex(), "patch_points": points,
                                  "marks": {k: v - start for k, v in t["marks"].items()}}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
