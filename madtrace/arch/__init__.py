# SPDX-License-Identifier: GPL-2.0-or-later
"""Architecture-specific code (only x86-64: ``madtrace.arch.x86_64``)."""
