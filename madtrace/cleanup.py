# SPDX-License-Identifier: GPL-2.0-or-later
"""A recording and the mappings madtrace leaves in its target.

At attach, what an earlier session (killed) left is found and taken out
before anything is installed (inject/leftovers.py); at detach every mapping
this session made is unmapped (inject/footprint.py), and a fork child's
copies too.  Each says in one line what it did (the recording's log) and
keeps the details in meta.json (``leftovers``, ``released``)."""

from __future__ import annotations


def recover_leftovers(recording) -> None:
    from .inject.leftovers import recover
    found = recover(recording.tracee, recording.address_space)
    if not found:
        return
    recording.leftovers_line = found.line(recording.tracee.pid)
    recording.log(recording.leftovers_line)
    release = found.release
    recording.meta["leftovers"] = {
        "sites_restored": [{"address": a, "module": m} for a, m in found.sites],
        "areas": found.areas, "unmapped": len(release.unmapped),
        "bytes_unmapped": sum(n for _, n in release.unmapped),
        "returns_given_back": release.returns, "guard": found.guard,
        "kept": [{"area": n, "bytes": b, "why": w} for n, b, w in found.held + release.kept]}


def release_footprint(recording, tracee) -> None:
    """At detach (every thread stopped, every patch reverted)."""
    if tracee.footprint is None:
        return
    result = tracee.footprint.release(tracee)
    if result.unmapped or result.kept:
        recording.log(result.line(tracee.pid))
    released = recording.meta.setdefault("released", {"unmapped": 0, "bytes": 0, "kept": []})
    released["unmapped"] += len(result.unmapped)
    released["bytes"] += sum(n for _, n in result.unmapped)
    released["returns_given_back"] = released.get("returns_given_back", 0) + result.returns
    released["kept"] += [{"area": name, "bytes": n, "why": why} for name, n, why in result.kept]


def release_in_child(recording, parent, child) -> None:
    """A fork child, after every engine undid its part there."""
    if parent.footprint is None or not parent.footprint.areas:
        return
    result = parent.footprint.release(child, copy=True)
    if recording.functions is not None:
        recording.functions.child_released(child, result.kept)
