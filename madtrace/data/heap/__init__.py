# SPDX-License-Identifier: GPL-2.0-or-later
"""Heap tracking: malloc & co. and memcpy & co. hooked (breakpoints or in-target
stubs), the blocks' interval index and forged names."""
