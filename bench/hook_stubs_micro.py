# SPDX-License-Identifier: GPL-2.0-or-later
"""The hook stubs' own instructions, alone (bench_hooks.py runs this file).

injector/trampolines.S's hook_copy and hook_alloc templates, instantiated in
this process as inline_hooks.py instantiates them in a target, in front of
libc's memcpy, malloc and free: a control block and slot table holding this
thread's ring, a ring whose LIMIT never comes (no drain, no wait: the stubs
alone), the traced-page and alias bitmaps with a buffer's pages set, the
buffer mapped twice (at its address and at address ^ 2**45).  A C loop
(bench/progs/hook_loop.c, built into a temporary directory) calls each
function through a pointer; the minimum of 7 timings.  Prints ns per call:
memcpy of 64 bytes between untraced buffers (the stub's page check, then the
call) and between traced ones (a block event's group, the call through the
alias), a malloc/free pair (four groups, two stamps), each beside the
function called directly (``--json``: one JSON object).

Run with PYTHONPATH pointing at the madtrace tree.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile

from madtrace.target.templates import load_injector

HERE = os.path.dirname(os.path.abspath(__file__))
BUFFER, SIZE, ALIAS_BIT = 0x200000000, 1 << 16, 1 << 45
RW, RWX = 3, 7
FIXED, SHARED, PRIVATE, ANON, NORESERVE = 0x10, 1, 2, 0x20, 0x4000
CALLS = 2_000_000

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]


def _map(address: int, size: int, prot: int, flags: int, fd: int = -1) -> int:
    got = libc.mmap(address, size, prot, flags, fd, 0)
    if got in (None, 2**64 - 1) or (address and got != address):
        raise OSError(ctypes.get_errno(), f"mmap {address:#x}")
    return got


def _address(function) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value or 0


def _loops():
    build = tempfile.mkdtemp(prefix="hook-loop-")
    library = os.path.join(build, "libloop.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", library,
                    os.path.join(HERE, "progs", "hook_loop.c")], check=True)
    loop = ctypes.CDLL(library)
    loop.copies.restype = loop.pairs.restype = ctypes.c_double
    loop.copies.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_long]
    loop.pairs.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    return loop


class Lab:
    """A ring, the bitmaps and the aliased buffer, in this process."""

    def __init__(self):
        L = self.L = load_injector()
        fd = os.memfd_create("hook-stubs-micro")
        os.ftruncate(fd, SIZE)
        _map(BUFFER, SIZE, RW, FIXED | SHARED, fd)
        _map(BUFFER ^ ALIAS_BIT, SIZE, RW, FIXED | SHARED, fd)
        self.traced = _map(0, 1 << 32, RW, PRIVATE | ANON | NORESERVE)
        self.alias = _map(0, 1 << 32, RW, PRIVATE | ANON | NORESERVE)
        for bitmap in (self.traced, self.alias):
            ctypes.memset(bitmap + (BUFFER >> 15), 0xFF, SIZE >> 15)
        self.ctl = _map(0, L.MT_CONTROL_AREA, RW, PRIVATE | ANON)
        self.ring = _map(0, L.MT_RING_BLOCK, RW, PRIVATE | ANON)
        self.code = _map(0, 1 << 16, RWX, PRIVATE | ANON)
        ctypes.memmove(self.code + 0x8000, bytes.fromhex("64488b042500000000c3"), 10)  # fs:[0]
        key = ~ctypes.CFUNCTYPE(ctypes.c_uint64)(self.code + 0x8000)() & (2**64 - 1)
        slot = self.ctl + L.MT_SLOT_TABLE + (((key & 0xFFFFFFFF) >> (L.MT_SLOT_HASH_SHIFT - 4))
                                             & ((L.MT_SLOTS - 1) << 4))
        ctypes.memmove(slot, struct.pack("<QQ", key, self.ring), 16)
        ctypes.memmove(self.ring + L.MT_RING_LIMIT, struct.pack("<Q", 1 << 62), 8)
        ctypes.memmove(self.ring + L.MT_RING_CONTROL, struct.pack("<Q", self.ctl), 8)
        ctypes.memmove(self.ctl + L.MT_CTL_FLAGS, b"\x01", 1)

    def stub(self, name: str, at: int, function: int) -> int:
        """A stub of template ``name`` at ``at`` whose continuation is ``function``."""
        L = self.L
        slot = at + 0x1800
        ctypes.memmove(slot, struct.pack("<QQ", function, 0), 16)
        fields = dict(ctl_entry=self.ctl, cont=slot)
        if name == "hook_alloc":
            fields.update(gadget=slot + 8, ctl_ret=self.ctl,
                          code_entry=(L.MT_HOOK_CODE | 1 << 2) - (1 << 32),
                          code_return=(L.MT_HOOK_CODE | 1 << 2 | 1) - (1 << 32))
        else:
            fields.update(traced=self.traced, alias=self.alias, contjmp=slot,
                          code=(L.MT_HOOK_CODE | 2 << 2) - (1 << 32))
        template = L.templates[name]
        ctypes.memmove(at, bytes(template.instantiate(at, **fields)), template.size)
        return at

    def rewind(self) -> None:
        ctypes.memmove(self.ring + self.L.MT_RING_HEAD, struct.pack("<Q", 0), 8)


def best(measure) -> float:
    return min(measure() for _ in range(7))


def main() -> int:
    lab, loop = Lab(), _loops()
    memcpy, malloc, free = (_address(f) for f in (libc.memcpy, libc.malloc, libc.free))
    copy_stub = lab.stub("hook_copy", lab.code, memcpy)
    malloc_stub = lab.stub("hook_alloc", lab.code + 0x2000, malloc)
    free_stub = lab.stub("hook_alloc", lab.code + 0x4000, free)
    a, b = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
    src, dst = ctypes.addressof(a), ctypes.addressof(b)

    def copies(function, to, source, calls):
        def measure():
            lab.rewind()
            return loop.copies(function, to, source, 64, calls)
        return best(measure)

    def pairs(allocate, release, calls):
        def measure():
            lab.rewind()
            return loop.pairs(allocate, release, calls)
        return best(measure)

    result = {
        "memcpy 64 B, untraced, native": copies(memcpy, dst, src, CALLS),
        "memcpy 64 B, untraced, through the stub": copies(copy_stub, dst, src, CALLS),
        "memcpy 64 B, traced, native": copies(memcpy, BUFFER + 128, BUFFER, CALLS // 8),
        "memcpy 64 B, traced, through the stub (group, alias)":
            copies(copy_stub, BUFFER + 128, BUFFER, CALLS // 8),
        "malloc+free 48 B, native": pairs(malloc, free, CALLS),
        "malloc+free 48 B, through the stubs (4 groups, 2 stamps)":
            pairs(malloc_stub, free_stub, CALLS // 8),
    }
    if "--json" in sys.argv:
        print(json.dumps(result))
    else:
        for what, ns in result.items():
            print(f"{what:58s} {ns:7.1f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
