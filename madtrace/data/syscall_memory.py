"""Which traced pages a system call may read or write through its arguments.

The kernel never faults on a protected page touched by a system call: the
call fails with EFAULT (pitfall 4).  Before a call runs, the data engine
opens exactly the protected pages it may touch:
- a (pointer, length) pair of the read/write family: every page of the range;
- an iovec array (readv/writev/preadv/pwritev, and sendmsg/recvmsg through
  their msghdr): the array and every buffer it lists;
- any other argument that points into a protected page: that page and the
  next (a structure may cross a page boundary);
- execve/execveat: everything (argument strings may be anywhere; the image is
  replaced anyway).
"""

from __future__ import annotations

import struct

from ..trace.format import PAGE
ALL = None

# syscall number -> ((pointer arg index, length arg index), ...)
BUFFERS = {
    0: ((1, 2),), 1: ((1, 2),), 17: ((1, 2),), 18: ((1, 2),),      # read write pread64 pwrite64
    44: ((1, 2),), 45: ((1, 2),),                                  # sendto recvfrom
    89: ((1, 2),), 267: ((2, 3),),                                 # readlink readlinkat
    318: ((0, 1),), 217: ((1, 2),), 78: ((1, 2),),                 # getrandom getdents64 getdents
}
IOVECS = {19: (1, 2), 20: (1, 2), 295: (1, 2), 296: (1, 2), 327: (1, 2), 328: (1, 2)}
MSGHDRS = {46: 1, 47: 1}                                           # sendmsg recvmsg
EVERYTHING = {59, 322}                                             # execve execveat
MAX_IOV = 1024


def _range_pages(start: int, length: int) -> set[int]:
    if length <= 0:
        return set()
    length = min(length, 1 << 32)
    return set(range(start & ~(PAGE - 1), start + length, PAGE))


def _iovec_pages(read_memory, address: int, count: int) -> set[int]:
    pages = _range_pages(address, 16 * count)
    try:
        raw = read_memory(address, 16 * min(count, MAX_IOV))
    except Exception:
        return pages
    for base, length in struct.iter_unpack("<QQ", raw):
        pages |= _range_pages(base, length)
    return pages


def syscall_pages(nr: int, args: list[int], protected, read_memory) -> set[int] | None:
    """The protected pages the call may touch (None: all of them)."""
    if nr in EVERYTHING:
        return ALL
    pages: set[int] = set()
    for pointer, length in BUFFERS.get(nr, ()):
        pages |= _range_pages(args[pointer], args[length])
    if nr in IOVECS:
        vec, count = IOVECS[nr]
        pages |= _iovec_pages(read_memory, args[vec], args[count])
    if nr in MSGHDRS:
        msghdr = args[MSGHDRS[nr]]
        pages |= _range_pages(msghdr, 56)
        try:
            name, namelen, iov, iovlen, control, controllen = struct.unpack(
                "<QI4xQQQQ", read_memory(msghdr, 48))
            pages |= _range_pages(name, namelen) | _range_pages(control, controllen)
            pages |= _iovec_pages(read_memory, iov, iovlen)
        except Exception:
            pass
    for value in args:
        page = value & ~(PAGE - 1)
        if page in protected:
            pages.update((page, page + PAGE))
    return {p for p in pages if p in protected}
