"""Offline analysis of trace directories.

Each module reads what ``madtrace record`` wrote and rebuilds something a
person can read.  ``trace.segmentation`` is the one exact replay of the
per-thread call records (``calls/<tid>.rec``, frame rules in ``replay.c``)
merged with the data accesses (``data/<tid>.acc``): every dynamic call and
the call of every access, as ordered per-thread event chunks.  ``calltree`` builds
per-function statistics and a calling-context tree on it, ``segments`` the
segmented listing.  One module per data analysis of ``madtrace report``:
``heatmap`` (accesses per page, MadT's Fig. 1), ``alloc_usage`` (heap blocks
and allocation sites), ``numa`` (NUMAPROF's metrics), ``footprint`` (Skadu's
SlimTV, core in ``footprint.c``; ``footprint_naive`` is its reference),
``source_lines`` (accesses per DWARF source line); ``trace_input`` is what
they share.  The modules only read the trace directory; they never
touch a live process.
"""
