# SPDX-License-Identifier: GPL-2.0-or-later
"""maps"""

from __future__ import annotations

from ...binary.maps import read_maps
from ..registry import Command, register


@register
class Maps(Command):
    """The target's memory map now (/proc/PID/maps), each mapping with its
    region name; madtrace's own areas (rings, trampolines) are marked."""

    name = "maps"
    summary = "memory map of the target"
    json_form = True

    def run(self, session, args):
        from ...target.areas import MAPS_PREFIX   # the daemon's side (numpy): not the client's
        return [{"start": m.start, "end": m.end, "perms": m.perms, "offset": m.offset,
                 "path": m.path, "label": m.label, "madtrace": m.path.startswith(MAPS_PREFIX)}
                for m in read_maps(session.pid)]

    def render(self, maps):
        return "\n".join(f"{m['start']:#014x}-{m['end']:#014x} {m['perms']} {m['label']:<24} "
                         f"{m['path']}{'  [madtrace]' if m['madtrace'] else ''}" for m in maps)
