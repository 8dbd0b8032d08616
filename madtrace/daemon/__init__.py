# SPDX-License-Identifier: GPL-2.0-or-later
"""The daemon that keeps a live session after the terminal is gone, its control
socket, and the resident process."""
