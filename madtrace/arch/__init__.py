# SPDX-License-Identifier: GPL-2.0-or-later
"""The instruction set: decoding, re-encoding and relocating x86-64 code with capstone
(``x86_64``; the only architecture madtrace runs on)."""
