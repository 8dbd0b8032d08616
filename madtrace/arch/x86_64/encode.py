# SPDX-License-Identifier: GPL-2.0-or-later
"""The direct branches madtrace writes into a target: ``E9``/``E8 rel32``.

``encode_jmp(src, dst)`` / ``encode_call(src, dst)``: the 5 bytes at ``src``
reaching ``dst``, None when ``dst`` is out of rel32 range (the relocator
then refuses).  ``jmp_rel32(src, dst)``: a jump that must reach (patches and
stubs placed within rel32 reach of their targets by construction);
TracerInternalError otherwise.  ``JMP_REL32``: the opcode (recognising a
patch).  The only encoder of these branches: capstone-free, so that the
injection layer can use it without the decoder.
"""

from __future__ import annotations

from ...errors import TracerInternalError

JMP_REL32 = 0xE9
CALL_REL32 = 0xE8
BRANCH_SIZE = 5
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


def rel32(src_end: int, dst: int) -> bytes | None:
    """The displacement from the end of an instruction to ``dst``, or None."""
    d = dst - src_end
    if not _I32_MIN <= d <= _I32_MAX:
        return None
    return d.to_bytes(4, "little", signed=True)


def encode_jmp(src: int, dst: int) -> bytes | None:
    r = rel32(src + BRANCH_SIZE, dst)
    return None if r is None else bytes([JMP_REL32]) + r


def encode_call(src: int, dst: int) -> bytes | None:
    r = rel32(src + BRANCH_SIZE, dst)
    return None if r is None else bytes([CALL_REL32]) + r


def jmp_rel32(src: int, dst: int) -> bytes:
    code = encode_jmp(src, dst)
    if code is None:
        raise TracerInternalError(f"jmp at {src:#x} cannot reach {dst:#x} (beyond rel32)")
    return code
