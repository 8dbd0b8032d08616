"""Trace directories: what a recording leaves on disk (see ``store``)."""
