# SPDX-License-Identifier: GPL-2.0-or-later
"""Live sessions: the REPL, batch files, and one module per REPL command (commands/)."""
