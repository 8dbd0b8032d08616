# SPDX-License-Identifier: GPL-2.0-or-later
"""The data engine (the MadT technique): traced regions, page protections, system
calls, the guard; its two ways of recording accesses (fault/, hybrid/) and heap
tracking (heap/)."""
