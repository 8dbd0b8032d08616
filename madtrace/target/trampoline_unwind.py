# SPDX-License-Identifier: GPL-2.0-or-later
"""Unwind information for call-site trampolines, so that a C++ exception (or
any DWARF unwind: backtraces, thread cancellation) passes through them.

A call-site trampoline re-issues the original call, so while the callee runs
its return address points into the trampoline, where no module's
``.eh_frame`` says anything: an unwinder would stop there and the C++
runtime would call ``std::terminate``.  As JIT compilers do, madtrace
registers unwind information for that return point with the target's own
unwinder (libgcc's ``__register_frame_info``).  The trampoline has no frame
of its own (at the re-issued call every register and the stack pointer are
as at the original call site), so its FDE describes a pseudo-frame that is
the caller's frame as seen from the original return address:

    CFA = rsp + 8
    rsp = CFA - 8                      (DW_CFA_val_offset: the stack pointer is unchanged)
    return address = <site + 5>        (DW_CFA_val_expression: a constant)
    every other register: unchanged

The unwinder then steps to ``site + 5`` in the caller with the caller's own
stack pointer and registers, finds the caller's FDE and LSDA there, and runs
its landing pads (catch clauses, destructors) exactly as without madtrace.
The CFA is not the stack pointer itself because libgcc tells frames apart by
their CFA: with CFA = rsp the caller's frame would look like the
pseudo-frame (both would be known by the stack pointer at the call), and the
search for the handler frame would stop one frame early and abort.
The exit record of a call left by an exception is not written; the call
replay closes that frame by stack pointer, as for ``longjmp``.

``eh_frame(entries)`` builds one ``.eh_frame``-format object: one CIE, one
FDE per ``(pc_begin, pc_end, return_to)`` and the zero terminator, with
absolute (``DW_EH_PE_absptr``) addresses, so the bytes may live anywhere.

``frames_eh_frame(entries)`` does the same for code that has a frame of its
own (the hybrid engine's allocator hook stubs, data/heap/inline_hooks.py, at the
return from the function they call): one FDE per ``(pc_begin, pc_end,
cfa_offset)``: CFA = rsp + cfa_offset, the return address at CFA - 8, the
stack pointer = CFA, every other register unchanged.

``registrar(space)``: the target's ``__register_frame_info`` and
``__deregister_frame_info`` (those of the module that holds the C++ unwinder,
``_Unwind_RaiseException``), or None when no such unwinder is loaded.
``OBJECT_SIZE`` bytes of zeroed, writable memory are libgcc's ``struct
object`` for that registration (no malloc inside the target).
"""

from __future__ import annotations

import struct

# room for libgcc's struct object (6 pointers and a size_t on x86-64 in every
# version seen; generously rounded)
OBJECT_SIZE = 128

DW_CFA_def_cfa = 0x0C
DW_CFA_offset = 0x80         # | register, then a ULEB factored offset
DW_CFA_val_offset = 0x14
DW_CFA_val_expression = 0x16
DW_CFA_nop = 0x00
DW_OP_const8u = 0x0E
DW_EH_PE_absptr = 0x00
REG_RSP = 7
REG_RA = 16          # the return address column of x86-64


def _uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _sleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        done = (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40)
        out.append(byte | (0 if done else 0x80))
        if done:
            return bytes(out)


def _record(body: bytes) -> bytes:
    """A CIE or FDE: u32 length, then the body padded with DW_CFA_nop to 8 bytes."""
    body += bytes([DW_CFA_nop]) * (-(len(body) + 4) % 8)
    return struct.pack("<I", len(body)) + body


def _cie() -> bytes:
    body = struct.pack("<I", 0)                  # CIE id
    body += bytes([1]) + b"zR\0"                 # version 1, augmentation
    body += _uleb(1) + _sleb(-8) + bytes([REG_RA])
    body += _uleb(1) + bytes([DW_EH_PE_absptr])  # augmentation data: FDE address encoding
    return _record(body)


def _fde(cie_offset: int, fde_offset: int, pc_begin: int, pc_end: int, return_to: int) -> bytes:
    expression = bytes([DW_OP_const8u]) + struct.pack("<Q", return_to)
    program = bytes([DW_CFA_def_cfa]) + _uleb(REG_RSP) + _uleb(8)
    program += bytes([DW_CFA_val_offset]) + _uleb(REG_RSP) + _uleb(1)   # 1 * data_align (-8)
    program += bytes([DW_CFA_val_expression]) + _uleb(REG_RA) + _uleb(len(expression)) + expression
    # the CIE pointer is the distance from this field (4 bytes into the FDE) back to the CIE
    body = struct.pack("<I", fde_offset + 4 - cie_offset)
    body += struct.pack("<QQ", pc_begin, pc_end - pc_begin) + _uleb(0) + program
    return _record(body)


def eh_frame(entries: list[tuple[int, int, int]]) -> bytes:
    """One registrable .eh_frame object for ``(pc_begin, pc_end, return_to)`` entries."""
    out = bytearray(_cie())
    for pc_begin, pc_end, return_to in sorted(entries):
        out += _fde(0, len(out), pc_begin, pc_end, return_to)
    return bytes(out) + struct.pack("<I", 0)


def _frame_fde(cie_offset: int, fde_offset: int, pc_begin: int, pc_end: int, cfa: int) -> bytes:
    program = bytes([DW_CFA_def_cfa]) + _uleb(REG_RSP) + _uleb(cfa)
    program += bytes([DW_CFA_offset | REG_RA]) + _uleb(1)       # at CFA + 1 * data_align (-8)
    body = struct.pack("<I", fde_offset + 4 - cie_offset)
    body += struct.pack("<QQ", pc_begin, pc_end - pc_begin) + _uleb(0) + program
    return _record(body)


def frames_eh_frame(entries: list[tuple[int, int, int]]) -> bytes:
    """One registrable .eh_frame object for ``(pc_begin, pc_end, cfa_offset)`` entries."""
    out = bytearray(_cie())
    for pc_begin, pc_end, cfa in sorted(entries):
        out += _frame_fde(0, len(out), pc_begin, pc_end, cfa)
    return bytes(out) + struct.pack("<I", 0)


def registrar(space) -> tuple[int, int] | None:
    """(__register_frame_info, __deregister_frame_info) of the module that holds the
    target's C++ unwinder (libgcc_s; glibc exports compat copies whose registrations
    that unwinder never sees), or None when none is loaded."""
    def exported(name: str):
        return [ms for ms in space.find_functions(name)
                if ms.symbol.dynamic and ms.symbol.binding != "LOCAL" and ms.symbol.address]
    unwinders = {ms.module.name for ms in exported("_Unwind_RaiseException")}
    found = {}
    for name in ("__register_frame_info", "__deregister_frame_info"):
        found[name] = next((ms.address for ms in exported(name) if ms.module.name in unwinders), 0)
    if not all(found.values()):
        return None
    return found["__register_frame_info"], found["__deregister_frame_info"]
