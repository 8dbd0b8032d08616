"""Offline analysis of trace directories.

Each module reads what ``madtrace record`` wrote and rebuilds something a
person can read: ``calltree`` replays the per-thread call records
(``calls/<tid>.rec``) into dynamic calls, per-function statistics and a
calling-context tree.  The modules only read the trace directory; they never
touch a live process.
"""
