# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace doctor [--json]: whether tracing works on this machine, and what to do
where it does not.  Each check is tried for real where it can be (a child is
seized with ptrace, a memfd made, each native library loaded), not guessed from
settings; one line each, with its fix.  Exit 0 when tracing will work, 26
(MachineError) otherwise; optional tools (the tests' oracles) never fail it."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import sys
import sysconfig
from dataclasses import asdict, dataclass

from ..errors import MachineError, PermissionDeniedError

NAME = "doctor"
HELP = "check that tracing works on this machine, and say what to do where it does not"
CAP_SYS_PTRACE = 19
LIBRARIES = ("libmtloop.so", "libmtdrain.so", "libmtreplay.so", "libmtblocks.so",
             "libmtfootprint.so", "libmtmemsim.so")
SYS_PROCESS_VM_READV = 310
MIN_KERNEL = (5, 3)     # PTRACE_GET_SYSCALL_INFO


@dataclass
class Check:
    name: str
    state: str          # "ok", "warn" (works, with a limit), "fail", "optional"
    says: str
    fix: str = ""


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: ok, and each check (name, state, says, fix)")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _status_field(name: str) -> str | None:
    """A field of /proc/self/status (its first word)."""
    for line in (_read("/proc/self/status") or "").splitlines():
        if line.startswith(name + ":"):
            return line.split()[1]
    return None


def _has_cap_sys_ptrace() -> bool:
    return bool(int(_status_field("CapEff") or "0", 16) >> CAP_SYS_PTRACE & 1)


def check_platform() -> Check:
    machine = os.uname().machine
    if sys.platform != "linux" or machine != "x86_64":
        return Check("platform", "fail", f"{sys.platform} {machine}: madtrace traces Linux "
                     "x86-64 programs only", "run it on a Linux x86-64 machine")
    release = os.uname().release
    try:
        version = tuple(int(x) for x in release.split("-")[0].split(".")[:2])
    except ValueError:
        version = MIN_KERNEL
    if version < MIN_KERNEL:
        return Check("platform", "fail", f"Linux {release}: PTRACE_GET_SYSCALL_INFO needs 5.3 "
                     "or later", "run it on a newer kernel")
    return Check("platform", "ok", f"Linux {release} x86-64")


def check_ptrace() -> Check:
    """A child of ours seized and let go: yama, capabilities and seccomp together."""
    from ..process import ptrace_raw as pr
    scope = _read("/proc/sys/kernel/yama/ptrace_scope")
    yama = f"kernel.yama.ptrace_scope = {scope}" if scope is not None else "no Yama"
    privileged = os.geteuid() == 0 or _has_cap_sys_ptrace()
    child = os.fork()
    if child == 0:          # the child waits to be killed
        signal.pause()
        os._exit(0)
    try:
        pr.seize(child, 0)
    except (OSError, PermissionDeniedError) as exc:
        why = "EPERM: not permitted" if isinstance(exc, PermissionDeniedError) else \
            errno.errorcode.get(exc.errno or 0, str(exc.errno))
        fix = ("allow it: sysctl kernel.yama.ptrace_scope=1 (or 0), or run madtrace with "
               "CAP_SYS_PTRACE" if scope in ("2", "3") else
               "in a container, allow ptrace (docker run --cap-add=SYS_PTRACE, or a seccomp "
               "profile that allows ptrace)")
        filtered = "; a seccomp filter is in force" if _status_field("Seccomp") == "2" else ""
        return Check("ptrace", "fail", f"seizing a child failed ({why}; {yama}{filtered})", fix)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    if scope == "1" and not privileged:
        return Check("ptrace", "warn", "works for programs madtrace launches; attaching to a "
                     "running process that is not madtrace's child is refused "
                     "(kernel.yama.ptrace_scope = 1)",
                     "to attach: sysctl kernel.yama.ptrace_scope=0, or run madtrace as root or "
                     "with CAP_SYS_PTRACE")
    return Check("ptrace", "ok", f"launch and attach ({yama}{', privileged' if privileged else ''})")


def check_kernel_features() -> Check:
    missing = []
    try:
        os.close(os.memfd_create("madtrace-doctor"))
    except OSError:
        missing.append("memfd_create")
    libc = ctypes.CDLL(None, use_errno=True)
    here, there = ctypes.create_string_buffer(8), ctypes.create_string_buffer(b"madtrace")

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    local = IoVec(ctypes.addressof(here), 8)
    remote = IoVec(ctypes.addressof(there), 8)
    if libc.syscall(SYS_PROCESS_VM_READV, os.getpid(), ctypes.byref(local), 1,
                    ctypes.byref(remote), 1, 0) != 8:
        missing.append("process_vm_readv")
    flags = ""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("flags"):
            flags = line
            break
    if " cx16" not in flags:
        missing.append("the CPU's cmpxchg16b (new threads of live sessions are then traced "
                       "from their creation)")
    if missing:
        return Check("kernel and CPU", "warn", "missing: " + ", ".join(missing),
                     "run madtrace on a machine that has them")
    return Check("kernel and CPU", "ok", "memfd_create, process_vm_readv, cmpxchg16b")


def check_native() -> Check:
    from ..native import INSTALLED, NATIVE_DIR, built, how_to_build
    problems = []
    for name in LIBRARIES:
        path = os.path.join(NATIVE_DIR, name)
        try:
            ctypes.CDLL(path)
        except OSError as exc:
            problems.append(f"{name}: {exc}")
    from ..trace.zstd import ZstdError, check_available
    try:
        check_available()
    except ZstdError as exc:
        problems.append(f"{exc}: install the Debian package libzstd1")
    reader = os.path.join(NATIVE_DIR, "mtdwarf")
    if not os.access(reader, os.X_OK):
        problems.append(f"{reader} is missing")
    templates = built("injector", "templates.json")
    if not os.path.exists(templates):
        problems.append(f"{templates} is missing")
    where = "in the package" if os.path.isdir(INSTALLED) else "in the checkout's build/"
    if problems:
        return Check("native parts", "fail", "; ".join(problems), how_to_build("native"))
    return Check("native parts", "ok", f"libraries, mtdwarf and the injector {where} "
                 f"({os.path.dirname(NATIVE_DIR)})")


def check_client() -> Check:
    from ..native import INSTALLED, built
    if os.path.isdir(INSTALLED):      # installed beside this environment's python
        path = os.path.join(sysconfig.get_path("scripts"), "madtrace-ctl")
    else:
        path = built("bin", "madtrace-ctl")
    if path and os.access(path, os.X_OK):
        return Check("madtrace-ctl", "ok", f"{path} (the commands without a Python starting)")
    return Check("madtrace-ctl", "warn", "not found: daemon and ctl run through the Python "
                 "command only (slower to start)", "reinstall madtrace, or run `make native` "
                 "in a checkout")


def check_cache() -> Check:
    from ..cache import disk
    folder = disk.cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".doctor-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        return Check("cache", "warn", f"{folder} is not writable ({exc.strerror}): every run "
                     "reads the binaries' DWARF and scans again",
                     "set MADTRACE_CACHE_DIR to a writable folder")
    return Check("cache", "ok", f"{folder} is writable")


def check_optional() -> list[Check]:
    out = []
    for tool, why, package in (("valgrind", "the tests' oracles (callgrind, lackey, memcheck)",
                                "valgrind"),
                               ("uftrace", "bench/bench_calls.py's comparison", "uftrace")):
        path = shutil.which(tool)
        out.append(Check(tool, "optional", f"{path}" if path else f"not installed ({why} only)",
                         "" if path else f"apt install {package}"))
    return out


def checks() -> list[Check]:
    found = [check_platform()]
    if found[0].state == "fail":
        return found
    return found + [check_ptrace(), check_kernel_features(), check_native(), check_client(),
                    check_cache(), *check_optional()]


def run(args) -> int:
    found = checks()
    ok = not any(c.state == "fail" for c in found)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [asdict(c) for c in found]}))
    else:
        print("madtrace doctor: " + ("tracing works on this machine" if ok else
                                     "tracing will not work here until the failures are fixed"))
        for c in found:
            line = f"  {c.state:<8} {c.name}: {c.says}"
            if c.fix:
                line += f"\n           fix: {c.fix}"
            print(line)
    if not ok:
        raise MachineError("this machine lacks what tracing needs: see the failures above"
                           if not args.json else "this machine lacks what tracing needs")
    return 0
