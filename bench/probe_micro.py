# SPDX-License-Identifier: GPL-2.0-or-later
"""The probe's own instructions, alone (bench_probe_path.py runs this file).

A small loop, ``mov rax, [rdi]; add rdx, rax; add rdi, 8; cmp rdi, rsi; jne``
over 64 KiB of aliased memory, is relocated by madtrace's own rewriter
(function_copy.copy_function) into a copy with a probe on its load, exactly as
the hybrid engine does in a target, and run in this process: a control block
and slot table holding this thread's ring, a ring whose LIMIT never comes (no
drain, no wait: the probe alone), the alias bitmap with the buffer's pages
set, and the buffer mapped twice (at its address and at address ^ 2**45).
Prints JSON: ns per access of the original loop (the floor) and of the copy,
the minimum of ``--repeat`` timings of ``--passes`` passes each.

Run with PYTHONPATH pointing at the madtrace tree to measure (its
build/injector/templates.json gives the probe).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
import sys
import time

from madtrace.arch.x86_64.function_copy import copy_function
from madtrace.target.templates import load_injector

LOOP = bytes.fromhex("48 8b 07 48 01 c2 48 83 c7 08 48 39 f7 75 f1"
                     "48 89 d0 c3".replace(" ", ""))
# outer: f(start, end, passes): for passes: inner loop over [start, end)
OUTER = bytes.fromhex(
    "49 89 f8"            # mov r8, rdi
    "48 31 d2"            # xor rdx, rdx
    "4c 89 c7"            # .outer: mov rdi, r8
    "e8 00 00 00 00"      # call inner (patched)
    "48 89 c2"            # mov rdx, rax
    "48 ff c9"            # dec rcx
    "75 f0"               # jne .outer
    "48 89 d0 c3".replace(" ", ""))
BUFFER = 0x200000000
SIZE = 1 << 16
ALIAS_BIT = 1 << 45

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]


def _map(address: int, size: int, prot: int, flags: int, fd: int = -1) -> int:
    got = libc.mmap(address, size, prot, flags, fd, 0)
    if got in (None, ctypes.c_void_p(-1).value) or (address and got != address):
        raise OSError(ctypes.get_errno(), f"mmap {address:#x}")
    return got


def main() -> int:
    passes = int(sys.argv[sys.argv.index("--passes") + 1]) if "--passes" in sys.argv else 200
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 7
    injector = load_injector()
    L = injector
    PROT_RWX = mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
    RW = mmap.PROT_READ | mmap.PROT_WRITE
    FIXED, SHARED, PRIVATE, ANON = 0x10, mmap.MAP_SHARED, mmap.MAP_PRIVATE, mmap.MAP_ANONYMOUS
    fd = os.memfd_create("probe-micro")
    os.ftruncate(fd, SIZE)
    _map(BUFFER, SIZE, mmap.PROT_READ, FIXED | SHARED, fd)          # the program's view
    _map(BUFFER ^ ALIAS_BIT, SIZE, RW, FIXED | SHARED, fd)          # the alias
    bitmap = _map(0, (BUFFER >> 15) + 4096, RW, PRIVATE | ANON)
    ctypes.memset(bitmap + (BUFFER >> 15), 0xFF, SIZE >> 15)
    ctl = _map(0, L.MT_CONTROL_AREA, RW, PRIVATE | ANON)
    ring = _map(0, L.MT_RING_BLOCK, RW, PRIVATE | ANON)
    code = _map(0, 1 << 16, PROT_RWX, PRIVATE | ANON)
    fs0 = code + 0x8000                                             # mov rax, fs:[0]; ret
    ctypes.memmove(fs0, bytes.fromhex("64488b042500000000c3"), 10)
    key = ~ctypes.CFUNCTYPE(ctypes.c_uint64)(fs0)() & (2**64 - 1)
    slot = ctl + L.MT_SLOT_TABLE + (((key & 0xFFFFFFFF) >> (L.MT_SLOT_HASH_SHIFT - 4))
                                     & ((L.MT_SLOTS - 1) << 4))
    ctypes.memmove(slot, struct.pack("<QQ", key, ring), 16)
    ctypes.memmove(ring + L.MT_RING_LIMIT, struct.pack("<Q", 1 << 62), 8)
    ctypes.memmove(ring + L.MT_RING_CONTROL, struct.pack("<Q", ctl), 8)
    ctypes.memmove(ctl + L.MT_CTL_FLAGS, b"\x01", 1)
    original, copied = code, code + 0x1000
    ctypes.memmove(original, LOOP, len(LOOP))
    ids = iter(range(1, 1 << 20))
    copy = copy_function(LOOP, original, original + len(LOOP), copied, injector,
                         lambda mem: True, lambda mem, *_: next(ids), ctl, bitmap)
    if not hasattr(copy, "code") or len(copy.probes) != 1:
        print(json.dumps({"error": f"loop not relocated with one probe: {copy}"}))
        return 1
    ctypes.memmove(copied, copy.code, len(copy.code))
    timings = {}
    for name, inner in (("floor", original), ("probe", copied)):
        at = code + (0x4000 if name == "floor" else 0x5000)
        outer = bytearray(OUTER)
        struct.pack_into("<i", outer, 10, inner - (at + 14))
        ctypes.memmove(at, bytes(outer), len(outer))
        # f(rdi=start, rsi=end, rdx=-, rcx=passes) via a SysV call: rcx is the 4th argument
        fn = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                              ctypes.c_uint64)(at)
        best = 1e9
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(BUFFER, BUFFER + SIZE, 0, passes)
            best = min(best, time.perf_counter() - t0)
        timings[name] = best / (passes * SIZE // 8) * 1e9
    head = struct.unpack("<Q", ctypes.string_at(ring + L.MT_RING_HEAD, 8))[0]
    expected = (1 + 2 * repeat) * 0 + repeat * passes * SIZE // 8
    print(json.dumps({"floor_ns": timings["floor"], "probe_ns": timings["probe"],
                      "records": head, "records_expected": expected,
                      "probe_bytes": len(copy.code) - len(LOOP)}))
    return 0 if head == expected else 1


if __name__ == "__main__":
    sys.exit(main())
