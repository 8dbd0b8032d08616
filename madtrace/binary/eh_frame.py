# SPDX-License-Identifier: GPL-2.0-or-later
"""The unwind table of an ELF image (.eh_frame, found through .eh_frame_hdr).

``EhFrame(image)``; ``fde_at(rel_addr) -> Fde | None``: the FDE whose range
holds ``rel_addr`` (binary search of .eh_frame_hdr's table, then the FDE and
its CIE decoded).  ``Fde``: ``start``, ``end`` (relative addresses: a
function's extent, also in a stripped image), ``lsda`` (its language-specific
data, C++ exception tables; 0: none), ``cie`` (``Cie``: code/data alignment,
return address column, initial instructions) and ``instructions`` (the FDE's
call frame instructions, bytes).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

DW_EH_PE_omit = 0xFF
DW_EH_PE_absptr, DW_EH_PE_uleb128, DW_EH_PE_udata2, DW_EH_PE_udata4, DW_EH_PE_udata8 = 0, 1, 2, 3, 4
DW_EH_PE_sleb128, DW_EH_PE_sdata2, DW_EH_PE_sdata4, DW_EH_PE_sdata8 = 9, 0xA, 0xB, 0xC
DW_EH_PE_pcrel, DW_EH_PE_datarel = 0x10, 0x30
DW_EH_PE_indirect = 0x80


def uleb(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def sleb(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if byte & 0x40:
                value -= 1 << shift
            return value, pos


ENCODED_SIZES = {DW_EH_PE_absptr: (8, "<Q"), DW_EH_PE_udata2: (2, "<H"),
                 DW_EH_PE_udata4: (4, "<I"), DW_EH_PE_udata8: (8, "<Q"),
                 DW_EH_PE_sdata2: (2, "<h"), DW_EH_PE_sdata4: (4, "<i"),
                 DW_EH_PE_sdata8: (8, "<q")}


def read_encoded(data: bytes, pos: int, enc: int, field_addr: int, datarel: int = 0):
    """A DW_EH_PE-encoded value at data[pos] -> (value, next pos); ``field_addr``:
    the field's own address (pcrel), ``datarel``: the datarel base.  The
    indirect bit is not followed (the value is the pointer's address); a value
    of 0 stays 0, as the unwinder reads it (no base added)."""
    if enc == DW_EH_PE_omit:
        return None, pos
    fmt = enc & 0x0F
    if fmt == DW_EH_PE_uleb128:
        value, pos = uleb(data, pos)
    elif fmt == DW_EH_PE_sleb128:
        value, pos = sleb(data, pos)
    else:
        size, code = ENCODED_SIZES[fmt]
        value = struct.unpack_from(code, data, pos)[0]
        pos += size
    app = enc & 0x70
    if app == DW_EH_PE_pcrel and value:
        value += field_addr
    elif app == DW_EH_PE_datarel and value:
        value += datarel
    return value, pos


@dataclass(frozen=True)
class Cie:
    code_align: int
    data_align: int
    ra_column: int
    augmentation: str
    fde_encoding: int
    lsda_encoding: int
    personality: int            # its address; with personality_indirect: the address of a pointer to it
    signal_frame: bool
    instructions: bytes
    personality_indirect: bool = False


@dataclass(frozen=True)
class Fde:
    start: int
    end: int
    lsda: int
    cie: Cie
    instructions: bytes


class EhFrame:
    def __init__(self, image):
        self._cies: dict[int, Cie | None] = {}
        self.image = image
        hdr = image.section(".eh_frame_hdr")
        frame = image.section(".eh_frame")
        self.ok = hdr is not None and frame is not None and hdr.size >= 12
        self.table: list[tuple[int, int]] = []
        if not self.ok:
            return
        self.frame_addr = frame.address
        self.frame = image.read(frame.offset, frame.size)
        data = image.read(hdr.offset, hdr.size)
        version, ptr_enc, count_enc, table_enc = data[:4]
        pos = 4
        _, pos = self._read(data, pos, ptr_enc, hdr.address)
        count, pos = self._read(data, pos, count_enc, hdr.address)
        if version != 1 or table_enc != (DW_EH_PE_datarel | DW_EH_PE_sdata4) or count is None:
            self.ok = False
            return
        entries = struct.unpack_from(f"<{2 * count}i", data, pos)
        self.table = [(hdr.address + entries[2 * i], hdr.address + entries[2 * i + 1])
                      for i in range(count)]
        self._starts = [s for s, _ in self.table]

    def _read(self, data: bytes, pos: int, enc: int, base: int, field_addr: int | None = None):
        """An encoded pointer at data[pos] (``base``: the address of data[0], also
        the base of datarel; the field's address for pcrel is ``field_addr``,
        default base + pos)."""
        return read_encoded(data, pos, enc, (base + pos) if field_addr is None else field_addr, base)

    def fde_at(self, rel_addr: int) -> Fde | None:
        if not self.ok:
            return None
        import bisect
        i = bisect.bisect_right(self._starts, rel_addr) - 1
        if i < 0:
            return None
        fde = self._fde(self.table[i][1])
        if fde is None or not fde.start <= rel_addr < fde.end:
            return None
        return fde

    def _fde(self, address: int) -> Fde | None:
        data, base = self.frame, self.frame_addr
        pos = address - base
        if not 0 <= pos < len(data):
            return None
        length = struct.unpack_from("<I", data, pos)[0]
        if length in (0, 0xFFFFFFFF):
            return None
        end = pos + 4 + length
        cie_ptr = struct.unpack_from("<I", data, pos + 4)[0]
        cie_pos = pos + 4 - cie_ptr
        if cie_pos not in self._cies:     # an image has few CIEs, shared by its FDEs
            self._cies[cie_pos] = self._cie(cie_pos)
        cie = self._cies[cie_pos]
        if cie is None:
            return None
        p = pos + 8
        start, p = self._read(data, p, cie.fde_encoding, base)
        size, p = self._read(data, p, cie.fde_encoding & 0x0F, base)
        lsda = 0
        if "z" in cie.augmentation:
            aug_len, p = uleb(data, p)
            aug_end = p + aug_len
            if "L" in cie.augmentation and cie.lsda_encoding != DW_EH_PE_omit:
                lsda, _ = self._read(data, p, cie.lsda_encoding, base)
                lsda = lsda or 0
            p = aug_end
        return Fde(start, start + size, lsda, cie, bytes(data[p:end]))

    def _cie(self, pos: int) -> Cie | None:
        data, base = self.frame, self.frame_addr
        if not 0 <= pos < len(data):
            return None
        length = struct.unpack_from("<I", data, pos)[0]
        end = pos + 4 + length
        if struct.unpack_from("<I", data, pos + 4)[0] != 0:
            return None
        version = data[pos + 8]
        p = pos + 9
        aug_end = data.index(b"\0", p)
        augmentation = data[p:aug_end].decode("ascii", "replace")
        p = aug_end + 1
        code_align, p = uleb(data, p)
        data_align, p = sleb(data, p)
        if version == 1:
            ra, p = data[p], p + 1
        else:
            ra, p = uleb(data, p)
        fde_enc, lsda_enc, personality, signal = DW_EH_PE_absptr, DW_EH_PE_omit, 0, False
        indirect = False
        if augmentation.startswith("z"):
            aug_len, p = uleb(data, p)
            q, aug_stop = p, p + aug_len
            for ch in augmentation[1:]:
                if ch == "R":
                    fde_enc, q = data[q], q + 1
                elif ch == "L":
                    lsda_enc, q = data[q], q + 1
                elif ch == "P":
                    enc, q = data[q], q + 1
                    indirect = bool(enc & DW_EH_PE_indirect)
                    personality, q = self._read(data, q, enc & ~DW_EH_PE_indirect, base)
                elif ch == "S":
                    signal = True
            p = aug_stop
        return Cie(code_align, data_align, ra, augmentation, fde_enc, lsda_enc, personality or 0,
                   signal, bytes(data[p:end]), indirect)
