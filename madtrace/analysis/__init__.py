"""Offline analysis of trace directories.

Each module reads what ``madtrace record`` wrote and rebuilds something a
person can read.  ``segmentation`` is the one exact replay of the per-thread
call records (``calls/<tid>.rec``, frame rules in ``replay.c``) merged with
the data accesses (``data/<tid>.acc``): every dynamic call and the call of
every access, as ordered per-thread event chunks.  ``calltree`` builds
per-function statistics and a calling-context tree on it, ``segments`` the
segmented listing.  The modules only read the trace directory; they never
touch a live process.
"""
