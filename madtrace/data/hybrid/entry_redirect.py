# SPDX-License-Identifier: GPL-2.0-or-later
"""The hybrid engine's entry redirection: a relocated function's entry jumps to
its latest copy, through an 8-byte slot in the code area (a newer copy takes
over with one aligned store), or, where function tracing patches the entry,
through its entry trampoline (entry_links.py). Split from rewriting.py."""
from __future__ import annotations

import ctypes
import struct

from ...arch.x86_64.decode import capstone_lite
from ...arch.x86_64.function_copy import FunctionCopy
from ...target.patchset import Patch, PatchConflict
from ...errors import MadtraceError, NotElfError
from ...calls.plan import module_scan

ENTRY_SLOT = 16          # jmp [rip + 0]; 2 bytes of padding; .quad target


def redirect_entry(rw, state, copy: FunctionCopy) -> None:
    """The function's entry jumps to ``copy`` (through a slot in the code area, or
    through function tracing's entry trampoline when it has one)."""
    if state.self_entry == "baked":
        return             # entered by on-stack replacement only (see the module)
    if rw.engine.entry_hooks.continue_at(state.start, copy.address):
        return     # a hook stub's function (inline_hooks.py): the stub goes on in the copy
    # function tracing's entry trampolines go on to the copy after their record
    # (also one written later: a function instrumented live); not one whose
    # branches to its own entry (a call, for function tracing) reach its start
    if not state.self_entry:
        rw.links.point(state.start, copy.address)
    if rw.links.traced(state.start):
        rw.stats["entries linked"] += 1
        return
    if state.slot:
        # a newer copy: one aligned 8-byte store, seen whole by a thread jumping through it
        offset = state.slot + 8 - state.slot_area.area.address
        ctypes.c_uint64.from_buffer(state.slot_area.area.local, offset).value = copy.address
        return
    area = rw.code_areas.newest[state.module.name]
    why = _entry_unpatchable(rw, state, copy)
    if why:
        rw.stats[f"entry not redirected: {why}"] += 1
        return
    slot = (area.cursor + 15) & ~15
    if slot + ENTRY_SLOT > area.area.end:
        return
    area.area.write(slot, b"\xff\x25\x02\x00\x00\x00\xcc\xcc" + struct.pack("<Q", copy.address))
    area.cursor = slot + ENTRY_SLOT
    original = rw.tracee.mem.read(state.start, 5)
    patch = Patch(state.start, original, b"\xe9" + struct.pack("<i", slot - state.start - 5),
                  f"entry of the relocated {state.start:#x}")
    held = rw.engine.hold_threads()
    try:
        rips = [rw.tracee.get_regs(t).rip for t, s in rw.tracee.threads.items()
                if not s.running]
        rw.patches.apply(rw.tracee.mem, [patch], rips)
        state.slot, state.slot_area = slot, area
        rw.stats["entries redirected"] += 1
    except PatchConflict as exc:
        rw.stats[f"entry not redirected: {exc}"] += 1
    finally:
        rw.engine.resume_threads(held)

def _padding_after(rw, state) -> bool:
    """Whether the bytes after a function shorter than 5 bytes, up to its start +
    5, are padding the jump to the copy may take: no function holds them (no
    symbol, no .eh_frame entry) and they decode as no-ops (the compiler's
    alignment: libsqlite3's 4-byte accessors ``mov eax, [rdi + 0x34]; ret``
    are followed by ``nopw``).  Never executed, so never missed; a branch into
    them is refused with the function's first bytes (``module_scan``)."""
    end, need = state.end, state.start + 5
    if any(rw.bounds(address) is not None for address in range(end, need)):
        return False
    try:
        raw = rw.tracee.mem.read(end, 16)
    except (OSError, MadtraceError):          # the end of the mapping
        return False
    at = end
    for insn in capstone_lite().disasm(raw, end):
        if insn.mnemonic not in ("nop", "int3"):
            return False
        at += insn.size
        if at >= need:
            return True
    return False


def _entry_unpatchable(rw, state, copy: FunctionCopy) -> str | None:
    """Why the entry cannot take the jump to the copy (a few lookups, whatever
    the number of patches and breakpoints)."""
    start = state.start
    if state.end - start < 5 and not _padding_after(rw, state):
        return "shorter than 5 bytes"
    if any(hooks.active and any(a in hooks.saved_bytes and a + len(hooks.saved_bytes[a]) > start
                                for a in range(start - hooks.max_cover + 1, start + 5))
           for hooks in rw.engine.all_hooks()):           # a breakpoint's int3s reach in
        return "a breakpoint of madtrace's"
    if rw.links.watching:
        patched = rw.links.patched(start, start + 5)
    else:       # function tracing's patches when data tracing began (no links)
        patched = any(a in rw.engine.patched_addresses for a in range(start - 4, start + 5))
    if patched:
        return "patched by function tracing"
    if any(t in copy.targets for t in range(start + 1, start + 5)):
        return "a branch targets its first bytes"
    bias = state.module.bias     # another function's (glibc's mempcpy jumps into memmove)
    try:
        into = module_scan(state.module).branches_into(start - bias, start + 5 - bias)
    except (OSError, ValueError, NotElfError) as exc:   # no scan: its first bytes may be a target
        return f"its module's branches are unknown ({exc})"
    if into:
        return "a branch of another function targets its first bytes"
    return None
