# SPDX-License-Identifier: GPL-2.0-or-later
"""The per-thread rings shared with the target: their layout on the tracer's side, the
slot table, the ring pool, and the drain and writer threads (C)."""
