"""madtrace: a ptrace-based function and data-access tracer for Linux x86-64."""

__version__ = "0.1.0"
