# SPDX-License-Identifier: GPL-2.0-or-later
"""The fault engine: every access to a traced page is one ptrace stop, carried out by
a stub on a per-thread slot."""
