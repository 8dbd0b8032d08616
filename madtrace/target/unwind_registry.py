# SPDX-License-Identifier: GPL-2.0-or-later
"""Registering unwind information with the target's own unwinder.

``Unwinder(space)`` finds libgcc's ``__register_frame_info`` and
``__deregister_frame_info`` in the module that also has
``_Unwind_RaiseException`` (glibc exports a compat copy whose registrations
that unwinder never sees).  ``UnwindObjects`` registers ``.eh_frame``
objects (unwind.py for call-site trampolines, copy_unwind.py for relocated
functions), packed into areas named ``madtrace-unwind`` (layout.h
``MT_UNWIND_*``: a chain of objects, each with its state, so that a later
session takes back what a killed one registered, leftovers.py), and takes
each back from the unwinder before its area is unmapped (mappings.py).
"""

from __future__ import annotations

import struct
from typing import Callable

from ..errors import TracerInternalError
from ..process.remote_syscall import RemoteCallBlocked, RemoteSyscalls
from .areas import SharedArea
from .trampoline_unwind import OBJECT_SIZE

AREA_NAME = "madtrace-unwind"
AREA_SIZE = 1 << 20
NOT_REGISTERED, BEING_REGISTERED, REGISTERED = 0, 1, 2


class Unwinder:
    """The target's DWARF unwinder (libgcc_s), if loaded."""

    def __init__(self, space):
        self.space = space
        self._registrar: int | None = None
        self._deregistrar: int | None = None
        self._absent_in: tuple | None = None   # the modules no unwinder was found among

    def _exported(self, name: str):
        return [ms for ms in self.space.find_functions(name)
                if ms.symbol.dynamic and ms.symbol.binding != "LOCAL" and ms.symbol.address]

    def registrar(self) -> int | None:
        """__register_frame_info of the unwinder, None while none is loaded (asked
        again each time until found: a later dlopen may load it)."""
        modules = (id(self.space.modules), len(self.space.modules))
        if self._registrar is None and self._absent_in != modules:
            unwinders = {ms.module.name for ms in self._exported("_Unwind_RaiseException")}
            for ms in self._exported("__register_frame_info"):
                if ms.module.name in unwinders:
                    self._registrar = ms.address
                    break
            else:       # asked again once the address space knows more modules
                self._absent_in = modules
        return self._registrar

    def deregistrar(self) -> int:
        """__deregister_frame_info of the unwinder that got the registrations."""
        if self._deregistrar is None:
            registrar = self.registrar()
            found = [ms for ms in self._exported("__deregister_frame_info")
                     if registrar is not None and ms.module.start <= registrar < ms.module.end]
            if not found:
                raise TracerInternalError("the unwinder has no __deregister_frame_info")
            self._deregistrar = found[0].address
        return self._deregistrar

    def module(self):
        """The unwinder's module (its data is what a registration writes)."""
        registrar = self.registrar()
        return None if registrar is None else self.space.module_for(registrar)


class UnwindObjects:
    """.eh_frame objects registered with the target's unwinder."""

    def __init__(self, unwinder: Unwinder, injector, group: str):
        self.unwinder = unwinder
        self.L = injector
        self.group = group
        self.area: SharedArea | None = None
        self.cursor = 0           # offset of the next object in ``area``
        self.last = -1            # offset of the area's last object (-1: none yet)
        self.registered = 0

    def register(self, rs: RemoteSyscalls, build: Callable[[int], bytes], size: int,
                 patient: bool = False) -> bool:
        """Registers the object ``build(address)`` (at most ``size`` bytes, made for
        where it will live).  ``patient``: give up (False, nothing registered) when
        the registering thread would wait for the unwinder's lock, which a stopped
        thread may hold."""
        L = self.L
        need = L.MT_UNWIND_FRAMES + ((size + 15) & ~15) + OBJECT_SIZE
        if self.area is None or self.cursor + need > self.area.size:
            self._new_area(rs, need)
        area = self.area
        assert area is not None
        start = area.address + self.cursor
        frames = start + L.MT_UNWIND_FRAMES
        blob = build(frames)
        if len(blob) > size:
            raise TracerInternalError(f"unwind object of {len(blob)} bytes, {size} planned")
        struct_object = frames + ((len(blob) + 15) & ~15)
        area.write(frames, blob)
        self._state(start, BEING_REGISTERED)
        if self.last >= 0:       # chained before it may be registered: a later session finds it
            area.write(area.address + self.last + L.MT_UNWIND_NEXT, struct.pack("<Q", self.cursor))
        self.last = self.cursor
        self.cursor += need
        registrar = self.unwinder.registrar()
        if registrar is None:
            raise TracerInternalError("no unwinder to register with")
        try:
            rs.call_function(registrar, frames, struct_object, patient=patient)
        except RemoteCallBlocked:
            self._state(start, NOT_REGISTERED)
            return False
        self._state(start, REGISTERED)
        self.registered += 1
        return True

    def _state(self, start: int, value: int) -> None:
        assert self.area is not None
        self.area.write(start + self.L.MT_UNWIND_STATE, struct.pack("<Q", value))

    def _new_area(self, rs: RemoteSyscalls, need: int) -> None:
        area = SharedArea(rs, max(AREA_SIZE, need), AREA_NAME, executable=False, group=self.group)
        area.before_unmap.append(lambda rs, area=area: self._deregister_all(rs, area))
        self.area, self.cursor, self.last = area, 0, -1

    def _deregister_all(self, rs: RemoteSyscalls, area: SharedArea) -> None:
        """The unwinder lets go of every object of ``area`` (before it is unmapped)."""
        L = self.L
        for offset in objects(lambda a: struct.unpack_from("<Q", area.local, a - area.address)[0],
                              area.address, L):
            start = area.address + offset
            if struct.unpack_from("<Q", area.local, offset + L.MT_UNWIND_STATE)[0] == REGISTERED:
                rs.call_function(self.unwinder.deregistrar(), start + L.MT_UNWIND_FRAMES)
                self._state_in(area, offset, NOT_REGISTERED)

    def _state_in(self, area: SharedArea, offset: int, value: int) -> None:
        area.write(area.address + offset + self.L.MT_UNWIND_STATE, struct.pack("<Q", value))


def objects(read_u64: Callable[[int], int], base: int, L) -> list[int]:
    """The offsets of the objects of an unwind area at ``base`` (its chain)."""
    out, offset = [0], 0
    while True:
        offset = read_u64(base + offset + L.MT_UNWIND_NEXT)
        if not offset or offset in out:
            return out
        out.append(offset)
