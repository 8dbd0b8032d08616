# SPDX-License-Identifier: GPL-2.0-or-later
"""The hybrid engine: faults find the instructions, their functions are copied with
probes that record each access in the target, through an alias of the traced memory."""
