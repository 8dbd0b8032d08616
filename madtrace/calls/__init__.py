# SPDX-License-Identifier: GPL-2.0-or-later
"""The function tracer (the HMTT_FBI technique): which functions, how each is patched,
call-site trampolines and entry patches, new threads of live sessions."""
