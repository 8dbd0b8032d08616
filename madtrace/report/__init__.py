# SPDX-License-Identifier: GPL-2.0-or-later
"""Output formats of ``madtrace report``: one module per format.

``text`` (the default, for a terminal), ``json_out`` (one JSON value),
``png`` (the heat map and bar charts, matplotlib with the Agg backend) and
``html`` (one self-contained page: annotated sources and every table).
Each renders the result objects of ``madtrace.analysis`` and never reads
the trace directory itself.
"""
