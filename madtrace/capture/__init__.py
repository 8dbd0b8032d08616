"""Event capture: the per-thread rings of function records (``rings``)."""
