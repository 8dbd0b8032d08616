# SPDX-License-Identifier: GPL-2.0-or-later
"""What madtrace maps and patches in a traced process: areas, templates, patch sets,
unwind information, what a killed session left, and how it all comes out again."""
