"""Error classes of madtrace, each with its own process exit code.

Every error that a user can cause (bad PID, missing command, corrupt trace
directory...) is one of these; the CLI prints ``madtrace: <message>`` on one
line and exits with ``exit_code``.  Exit codes are distinct per class so that
scripts can tell failures apart.  Codes stay below 64 so that they never
collide with 128+N, the status madtrace returns when its target dies of
signal N.
"""

import contextlib


class MadtraceError(Exception):
    """Base class. ``exit_code`` is the process status the CLI exits with."""

    exit_code = 10


class UsageError(MadtraceError):
    """Bad command-line arguments or options."""

    exit_code = 2


class NoSuchProcessError(MadtraceError):
    """The PID does not exist (or exited while we worked on it)."""

    exit_code = 11


class PermissionDeniedError(MadtraceError):
    """ptrace or /proc access was refused (EPERM/EACCES, yama, another tracer)."""

    exit_code = 12


class KernelThreadError(MadtraceError):
    """The PID is a kernel thread, which cannot be traced."""

    exit_code = 13


class CommandNotFoundError(MadtraceError):
    """The program to launch does not exist or is not executable."""

    exit_code = 14


class NotElfError(MadtraceError):
    """A file that should be an ELF x86-64 object is not."""

    exit_code = 15


class UnknownSymbolError(MadtraceError):
    """A function or variable name matched nothing (a -f pattern that never matched
    any function is reported at the end, once the trace is written)."""

    exit_code = 16


class OutputExistsError(MadtraceError):
    """An output file or directory exists and --force was not given."""

    exit_code = 17


class CorruptTraceError(MadtraceError):
    """A trace directory is missing files or has unreadable contents (a corrupt store
    is first rebuilt from the trace files)."""

    exit_code = 18


class TargetMemoryError(MadtraceError):
    """Reading or writing the target's memory failed (unmapped address...)."""

    exit_code = 19


class TracerInternalError(MadtraceError):
    """A ptrace call failed in a way that indicates a madtrace bug."""

    exit_code = 20


class StrippedBinaryError(MadtraceError):
    """The operation needs symbols the binary does not have."""

    exit_code = 21


class QueryError(MadtraceError):
    """An SQL query (madtrace query) failed: syntax, unknown column or view..."""

    exit_code = 22


class OutputError(MadtraceError):
    """An output cannot be written: a trace directory, an export or report file, the
    columnar store (read-only file system, missing parent, disk full...).  A recording
    whose disk fills up stops recording, lets the program go on and ends with it."""

    exit_code = 23


class StoreError(OutputError):
    """The columnar store of a trace directory cannot be written (read-only
    directory, disk full...)."""


@contextlib.contextmanager
def writing(path):
    """Turn an OSError met while writing ``path`` into a one-line OutputError."""
    try:
        yield
    except OSError as exc:
        raise OutputError(f"cannot write {exc.filename or path}: "
                          f"{exc.strerror or exc}") from None


class LeftoversError(MadtraceError):
    """The process still has what a killed session left that a new one cannot take
    out safely (the hybrid data engine's memory aliases): refused, nothing changed."""

    exit_code = 25


class MachineError(MadtraceError):
    """This machine lacks what tracing needs (madtrace doctor says what, and the fix)."""

    exit_code = 26


class NoDataError(MadtraceError):
    """The trace lacks what an analysis needs (data accesses, call records, NUMA
    observations): record it again with the option the message names."""

    exit_code = 24


class NotComparableError(MadtraceError):
    """Two traces that madtrace diff cannot compare: traces of different programs, or
    one with data accesses (or call records) that the other lacks."""

    exit_code = 27


class BinaryChangedError(MadtraceError):
    """A binary the trace names changed since the recording (its build-id differs):
    the trace's addresses would be named from the wrong code and data."""

    exit_code = 28
