# SPDX-License-Identifier: GPL-2.0-or-later
"""x86-64 code analysis for the call-site trampoline engine.

* ``callsites`` -- ``find_call_sites`` (direct call/jmp rel32 sites whose
  target is a function start), ``address_taken`` (functions that may be
  called indirectly), ``CallSite``, ``UnpatchableSite``, ``CallSiteScan``
* ``relocate``  -- ``relocate_entry`` (move a function's first >= 5 bytes
  into a trampoline), ``Relocation``, ``Refusal``, ``encode_jmp``,
  ``encode_call``
* ``decode``    -- shared capstone instances, ``decode_one``, ``sweep``

See each module's docstring for the full API.
"""

from .callsites import CallSite, CallSiteScan, UnpatchableSite, address_taken, find_call_sites
from .decode import decode_one
from .relocate import Refusal, Relocation, encode_call, encode_jmp, relocate_entry

__all__ = [
    "CallSite", "CallSiteScan", "UnpatchableSite", "address_taken", "find_call_sites",
    "decode_one", "Refusal", "Relocation", "encode_call", "encode_jmp", "relocate_entry",
]
