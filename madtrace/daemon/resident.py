# SPDX-License-Identifier: GPL-2.0-or-later
"""The resident madtrace process: ``madtrace daemon --resident``.

Starting a daemon costs more in start-up than in attaching: a fresh Python
and the tracer's imports (session, numpy, capstone, ...: ~0.3 s of CPU on an
idle machine, seconds on a loaded one).  The resident process imports them
once and then waits on ``<runtime dir>/resident.sock`` (same directory and
permissions as the daemons' sockets: 0700 dir, 0600 socket, peers of our uid
only).  ``madtrace daemon PID ...`` connects to it when it is there, hands it
its argument list, working directory, environment, umask and its stdin,
stdout and stderr (SCM_RIGHTS), and the resident forks a *worker*, which runs
the very same command line (``cli.main.main``) with those: it forks and
double-forks the daemon as the command would, prints the same messages on the
same terminal, and its exit code becomes the command's.  The resident itself
never traces anything (no ptrace: it cannot keep a target stopped), stays
single-threaded (it forks), and ends cleanly on SIGTERM or ``madtrace daemon
--stop-resident`` (its socket removed).  A resident whose madtrace files
changed since it started refuses, and the command starts the daemon itself.

A resident is also started *on demand*: a ``madtrace daemon PID`` that finds
none attaches by itself, then starts one in the background for the next
commands (``start_on_demand``), which ends after ``MADTRACE_RESIDENT_IDLE``
seconds without a command (600 by default; 0: none is started), and at once
when it refuses a command because madtrace's files changed (the next command
starts a fresh one).  ``--resident`` started by hand waits until it is
stopped, unless given ``--idle``.

The client side is resident_client.py (the standard library only: what the
command runs first).
"""

from __future__ import annotations

import functools
import json
import os
import math
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

from ..errors import TracerInternalError, UsageError
from ..native import built
from ..process import spawn_proxy
from . import resident_client, transport
from .resident_client import LOG_NAME, socket_path
from .resident_client import ask as _ask, connect as _connect, package_dir as _package_dir
from .detached import INTERNAL_ERROR, report, report_failure, start_detached

# the packages whose modules a daemon imports while attaching and instrumenting
# (none of them loads pyarrow, whose allocator starts a thread: the resident forks)
PRELOAD = ("target", "rings", "calls", "data", "recording", "process", "binary", "cache", "arch",
           "kinds", "live", "daemon")
# modules imported on first use while attaching and recording (the target stopped, or its
# first records waiting): numpy.ma (np.unique), the capture container and its checksums
LATE_IMPORTS = ("numpy.ma", "xxhash", "madtrace.trace.capture_file")
IMAGE_CACHE_MAX = 256       # ELF images the resident keeps parsed (see warm_images)
COMMON_LIBRARIES = ("libc.so", "ld-linux")   # parsed when the resident starts
# what names madtrace's cache directory (cache/disk.py cache_dir)
CACHE_ENVIRONMENT = ("MADTRACE_CACHE_DIR", "XDG_CACHE_HOME", "HOME")
# how long a resident started on demand waits for a command before it ends (seconds)
IDLE_ENVIRONMENT = "MADTRACE_RESIDENT_IDLE"
IDLE_DEFAULT = 600.0
# seconds a resident started on demand waits before it imports the tracer (~0.5 s of
# CPU): the attach that started it has its first records by then (without the wait,
# 0.13-0.18 s later on two cores)
DEMAND_DELAY = 1.0


def code_stamp() -> float:
    """The newest modification time of madtrace's Python files and native code."""
    newest = 0.0
    for top in (_package_dir(), built("native"), built("injector")):
        for path, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith((".py", ".so", ".json")):
                    try:
                        newest = max(newest, os.stat(os.path.join(path, name)).st_mtime)
                    except OSError:
                        pass
    return newest


# ------------------------------------------------------------------ client
def on_demand_idle() -> float:
    """Seconds a resident started on demand stays unused before it ends
    (MADTRACE_RESIDENT_IDLE; 0: no resident is started on demand)."""
    text = os.environ.get(IDLE_ENVIRONMENT, "").strip()
    if not text:
        return IDLE_DEFAULT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise UsageError(f"{IDLE_ENVIRONMENT}={text!r}: give the seconds a resident madtrace "
                         "process started on demand stays unused (0: none is started)")
    return value


def start_on_demand(idle: float) -> bool:
    """Starts a resident process in the background for the next commands, unless
    one listens already; does not wait for it (it imports the tracer once this
    command's attach is done: DEMAND_DELAY).  It ends after ``idle`` seconds
    without a command.  Returns whether one was started."""
    sock = _connect()
    if sock is not None:
        sock.close()
        return False
    code = (f"import sys, time; time.sleep({DEMAND_DELAY!r}); from madtrace.cli.main import main; "
            "sys.exit(main(sys.argv[1:]))")
    # this very package, wherever it was imported from (a checkout run from its folder)
    where = os.path.dirname(_package_dir())
    path = os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH")) if p)
    subprocess.Popen([sys.executable, "-c", code, "daemon", "--resident", "-q",
                      "--idle", repr(idle)], env=dict(os.environ, PYTHONPATH=path),
                     stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                     start_new_session=True, close_fds=True)
    return True


def stop_resident() -> int | None:
    """Asks the resident process to end; returns its pid (None: there was none)."""
    answer = _ask({"stop": True})
    if answer is None:
        return None
    pid = int(answer["pid"])
    for _ in range(500):                # until it has removed its socket and exited
        if not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z":
            break
        time.sleep(0.01)
    return pid


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


# ------------------------------------------------------------------ server
class _Stop(Exception):
    pass


def _on_sigterm(signum, frame):
    raise _Stop()


@dataclass(frozen=True)
class CommandLine:
    """The command line the resident runs for its clients, given by the CLI (which
    sits above this package): ``main(argv) -> exit code`` and ``daemon_options(argv)``,
    the parsed options of ``madtrace daemon ARGV``."""
    main: Callable[[list[str]], int]
    daemon_options: Callable[[list[str]], object]


def start_resident(command_line: CommandLine, idle: float = 0.0) -> dict:
    """Starts the resident process in the background; returns {"pid", "socket"}
    once it listens (or the running one's, with "running": True).  ``idle``:
    it ends after that many seconds without a command (0: when stopped)."""
    transport.ensure_runtime_dir()
    sock = _connect()
    if sock is not None:
        sock.close()
        pid = resident_pid()
        return {"pid": pid, "socket": socket_path(), "running": True}
    return start_detached(functools.partial(_resident_main, command_line=command_line,
                                            idle=idle),
                          "the resident madtrace process died while starting "
                          f"(see {os.path.join(transport.runtime_dir(), LOG_NAME)})")


def resident_pid() -> int | None:
    """The pid of the resident process that listens now (asked, not stopped)."""
    answer = _ask({"ping": True})
    return int(answer["pid"]) if answer is not None else None


def _resident_main(status_w: int, command_line: CommandLine, idle: float) -> int:
    listener = None
    bound = None
    try:
        os.chdir("/")
        runtime = transport.ensure_runtime_dir()
        log = os.open(os.path.join(runtime, LOG_NAME), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(devnull)
        os.close(log)
        _preload()
        stamp = code_stamp()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(socket_path())
        finally:
            os.umask(old_umask)
        os.chmod(socket_path(), 0o600)
        bound = os.stat(socket_path()).st_ino
        listener.listen(16)
        listener.settimeout(min(1.0, idle) if idle else 1.0)
        signal.signal(signal.SIGTERM, _on_sigterm)
    except BaseException as exc:
        if listener is not None:
            listener.close()
        return report_failure(status_w, exc)
    report(status_w, {"ok": True, "pid": os.getpid(), "socket": socket_path()})
    print(f"resident {os.getpid()} listening on {socket_path()}"
          + (f" (ends after {idle:g} s without a command)" if idle else ""), flush=True)
    try:
        _serve(listener, stamp, command_line, idle)
    except _Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # the cleanup is not interrupted
        listener.close()
        try:        # its own socket only: a new resident may have bound the path since
            if os.stat(socket_path()).st_ino == bound:
                os.unlink(socket_path())
        except FileNotFoundError:
            pass
        _reap()
        print(f"resident {os.getpid()} ended", flush=True)
    return 0


def _preload() -> None:
    """Imports what a daemon imports, so that its worker starts with it all; and
    the ELF files of this process (the C library and the loader, which most
    targets map too) parsed into the image cache, which workers inherit."""
    import importlib
    import pkgutil
    importlib.import_module("madtrace.cli.main")
    importlib.import_module("madtrace.cli.cmd_daemon")
    importlib.import_module("madtrace.cli.cmd_ctl")
    importlib.import_module("madtrace.daemon.server")
    importlib.import_module("madtrace.recording.recording")
    importlib.import_module("madtrace.trace.store_writer")   # imported while attaching
    for name in LATE_IMPORTS:
        importlib.import_module(name)
    for name in PRELOAD:
        package = importlib.import_module(f"madtrace.{name}")
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)
    if "pyarrow" in sys.modules or len(os.listdir("/proc/self/task")) != 1:
        raise TracerInternalError("the resident process must stay single-threaded: an import "
                                  "started a thread")
    from ..rings.tsc import start_calibration
    start_calibration()         # a window of the resident's lifetime: no wait in a worker
    warm_images(os.getpid(), only=COMMON_LIBRARIES)
    _scan_libc()


def _scan_libc() -> None:
    """The C library's scan (call sites, branches: plan.py), kept with its image:
    the ring pool hooks its fork and exec functions (calls/thread_pool.py).  A
    module's image is all a scan reads."""
    from types import SimpleNamespace
    from ..binary import elf
    from ..calls.plan import _ModuleScan
    for path, image in elf.parsed_images():
        if os.path.basename(path).startswith("libc.so"):
            _ModuleScan(SimpleNamespace(image=image))  # type: ignore[arg-type]


def warm_images(pid: int, only: tuple[str, ...] = ()) -> int:
    """Parses the ELF files process ``pid`` maps into the image cache (ElfImage.load:
    by path, device, inode, mtime and size), before a worker is forked to attach
    to it: that worker, and every later one whose target maps the same files,
    finds them parsed.  ``only``: the file names to parse start so (none: all).
    Returns how many were parsed now; a file that cannot be parsed is left to
    the worker (which says why)."""
    from ..binary import elf
    from ..binary.maps import read_maps
    try:
        mappings = read_maps(pid)
    except Exception:
        return 0
    parsed = 0
    for path in sorted({m.file_path for m in mappings if m.is_file and m.inode}):
        if only and not os.path.basename(path).startswith(only):
            continue
        if len(elf.parsed_images()) >= IMAGE_CACHE_MAX:
            break
        before = len(elf.parsed_images())
        try:
            elf.ElfImage.load(path)
        except Exception:
            continue
        parsed += len(elf.parsed_images()) - before
    return parsed


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _serve(listener: socket.socket, stamp: float, command_line: CommandLine,
           idle: float) -> None:
    last = time.monotonic()
    while True:
        _reap()
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            if idle and time.monotonic() - last >= idle:
                print(f"no command for {idle:g} s", flush=True)
                return
            continue
        last = time.monotonic()
        fds: list[int] = []
        try:
            conn.settimeout(10)
            uid = transport.peer_uid(conn)
            if uid != os.getuid():
                print(f"refused a connection from uid {uid}", flush=True)
                continue
            data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 5)
            while not data.endswith(b"\n"):
                more = conn.recv(1 << 20)
                if not more:
                    break
                data += more
            request = json.loads(data)
            if "stop" in request:
                transport.send(conn, {"pid": os.getpid()})
                raise _Stop()
            if "ping" in request:
                transport.send(conn, {"pid": os.getpid()})
                continue
            refused, ending = _refusal(request, fds, stamp, on_demand=idle > 0)
            if refused:
                print(f"refused: {refused}", flush=True)
                transport.send(conn, {"refused": refused})
                if ending:
                    raise _Stop()
                continue
            target = _daemon_target(request["argv"])
            if target:
                warm_images(target)
                warm_plan(target, request["argv"], command_line.daemon_options)
            if "child" in request:
                warm_copier(request)
            # SIGTERM blocked across the fork: it must never run the resident's
            # cleanup (removing its socket) in the worker
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                if os.fork() == 0:
                    listener.close()
                    _worker(conn, fds, request, command_line.main)     # never returns
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        except (OSError, ValueError, KeyError) as exc:
            print(f"a request failed: {exc!r}", flush=True)
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()


def warm_plan(pid: int, argv: list, daemon_options: Callable[[list[str]], object]) -> None:
    """``daemon PID -f F...``: what instrumenting F needs from the files (the
    modules' scans: plan.py, thread_pool.py), done here before the worker is
    forked, and kept with the images for the next attach to the same program
    (a scan of libpython takes a second or two on a loaded machine)."""
    try:
        from ..binary.address_space import AddressSpace
        from ..calls.plan import prepare_plan, split_patterns
        from ..calls.thread_pool import prepare
        patterns = daemon_options(argv).functions  # type: ignore[attr-defined]
        if not patterns:
            return
        space = AddressSpace.from_pid(pid)
        prepare_plan(space, split_patterns(space, patterns)[0])
        prepare(space)
    except (Exception, SystemExit) as exc:     # said by the worker, which does it again
        print(f"warm_plan: {exc!r}", flush=True)


def warm_copier(request: dict) -> None:
    """``record ... -- CMD``: the copier's disk caches (instruction entries, function
    analyses: data/hybrid/entry_cache.py, analysis_cache.py) of CMD and of the
    libraries parsed here, read now unless read before and unchanged, so that
    the worker finds them read (python3's are ~15 MB)."""
    try:
        from ..binary import elf
        from ..data.hybrid import analysis_cache, entry_cache
        argv = request["argv"]
        command = argv[argv.index("--") + 1]
        path = command if "/" in command else shutil.which(
            command, path=request["env"].get("PATH", os.defpath))
        images = [elf.ElfImage.load(os.path.join(request["cwd"], path))] if path else []
        images += [image for path, image in elf.parsed_images()
                   if os.path.basename(path).startswith(COMMON_LIBRARIES)]
        # the cache directory the worker will use: the client's environment's
        saved = {name: os.environ.get(name) for name in CACHE_ENVIRONMENT}
        try:
            for name in CACHE_ENVIRONMENT:
                os.environ.pop(name, None)
                if name in request["env"]:
                    os.environ[name] = request["env"][name]
            for image in images:
                entry_cache.preload(image)
                analysis_cache.preload(image)
        finally:
            for name, value in saved.items():
                os.environ.pop(name, None)
                if value is not None:
                    os.environ[name] = value
    except Exception as exc:        # the worker reads them itself
        print(f"warm_copier: {exc!r}", flush=True)


def _daemon_target(argv: list) -> int:
    """The PID of ``daemon PID ...`` (0: another command)."""
    if len(argv) >= 2 and argv[0] == "daemon" and str(argv[1]).isdigit():
        return int(argv[1])
    return 0


def _refusal(request: dict, fds: list[int], stamp: float, on_demand: bool) -> tuple[str, bool]:
    """(why the request is refused, or "": run it; whether the resident ends after
    saying so: one started on demand whose madtrace files changed, so that the
    next command starts a fresh one)."""
    if len(fds) != (5 if "child" in request else 3):
        return ("a request passes stdin, stdout and stderr (and a launched child's two pipes: "
                "madtrace-ctl record)"), False
    if "child" in request and (not isinstance(request["child"], int) or request["child"] <= 0
                               or (request.get("argv") or [""])[0] != "record"):
        return "a child to launch goes with a record command", False
    if request.get("package") != _package_dir() or request.get("python") != sys.executable:
        return (f"the resident process {os.getpid()} runs madtrace from {_package_dir()} with "
                f"{sys.executable}"), False
    if code_stamp() != stamp:
        then = ("it ends now" if on_demand else
                "restart it: madtrace daemon --stop-resident; madtrace daemon --resident")
        return (f"madtrace's files changed since the resident process {os.getpid()} started "
                f"({then})"), on_demand
    return "", False


def _worker(conn: socket.socket, fds: list[int], request: dict, main: Callable[[list[str]], int]) -> None:
    """In the forked worker: the command line as the client would have run it."""
    code = INTERNAL_ERROR
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
            os.close(fd)
        if "child" in request:      # madtrace-ctl record: the program it forked (spawn_proxy.py)
            go_fd, err_fd = fds[3:]
            spawn_proxy.offer(spawn_proxy.ProxyChild(int(request["child"]), go_fd, err_fd))
            transport.send(conn, {"worker": os.getpid()})    # where the client sends SIGTERM
        fds.clear()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(int(request["umask"]))
        resident_client.in_worker = os.getppid()
        code = main(list(request["argv"]))
    except SystemExit as exc:       # argparse's --help
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:    # reported as the command would: one line
        print(f"madtrace: internal error in the resident process's worker: {exc!r}",
              file=sys.stderr)
    finally:
        try:
            child = spawn_proxy.take()
            if child is not None:       # never launched: it exits without exec
                child.release()
            sys.stdout.flush()
            sys.stderr.flush()
            transport.send(conn, {"exit": code})
        finally:
            os._exit(0)
