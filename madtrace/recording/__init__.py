# SPDX-License-Identifier: GPL-2.0-or-later
"""A recording: launch or attach, the run loop, exec and dlopen, fork children, the
trace directory written at the end."""
