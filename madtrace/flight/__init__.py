# SPDX-License-Identifier: GPL-2.0-or-later
"""The flight recorder: a recording kept in bounded memory, the last SIZE or
SECONDS, written out as an ordinary trace directory when a trigger fires."""
