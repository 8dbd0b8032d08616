# SPDX-License-Identifier: GPL-2.0-or-later
"""The disk cache of what madtrace learns once per binary: one engine (``disk``:
where the files go, their keys, their checked container), used by the DWARF cache,
the symbol tables, the call-site scans and the copier's caches."""
