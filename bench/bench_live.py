"""Live sessions, measured side by side in one run, madtrace beside
Frida (PyPI frida: Interceptor with a CModule, and with JS callbacks) and
bpftrace (uprobes), each where it runs on this machine (the bench extra
installs frida; bpftrace is a Debian package).

On the C target (tests/progs/bench_live: it times its own loop) and on
python3 -m http.server (127.0.0.1, a bounded request loop):
- attach -> first event: from the tool's start to the first call recorded
  (madtrace: `daemon PID` + `ctl PID instrument`, the daemon started from
  scratch, and forked by the resident process, `madtrace daemon --resident`;
  `daemon PID -f F` forked by the resident process; the same command
  through build/bin/madtrace-ctl, the client that is not a Python interpreter;
  and the same again with a resident that attached to the program once
  before, unmeasured: "warm", its ELF files parsed; each other mode starts a
  resident process of its own: "cold"); and the plain commands as a user types
  them, the resident started on demand: `daemon PID -f F` with none running
  (it attaches by itself, then starts one), the same command next, and
  `daemon PID` + `ctl PID instrument F`;
- the longest pause of the target while attaching and instrumenting (the
  program's own loop measures it: "watch"), and, split by the stops
  madtrace reports (status stop_windows, on the program's clock), the
  longest pause during a stop and the longest other one (the machine's);
- the time to instrument 20 and ~900 libpython functions (madtrace: the ctl
  command, and how long the target was stopped);
- request latency of http.server untraced / attached with nothing
  instrumented / with PyDict_* instrumented (median of REQUESTS);
- ns per call, attached and launched (the program's own loop, N calls), each
  run starting with the disk quiet (``quiet_disk``): the watch before it has
  the tracer write ~4 GB of records in 6 s, whose write-back, were it left to
  the kernel, ran into the next run (21-37 ns per call instead of 19-26 in
  three pairs on the project's VM: the disk's figure, not the calls');
- events dropped on an attached run of 11 M calls (--no-time).
Each figure is the min / median of REPEATS interleaved repeats.
MADTRACE_BENCH_QUICK=1 runs fewer repeats and smaller N."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from common import ROOT, prog, table

QUICK = bool(os.environ.get("MADTRACE_BENCH_QUICK"))
REPEATS = 2 if QUICK else 3
CALLS = 2_000_000 if QUICK else 11_000_000
REQUESTS = 30 if QUICK else 100
MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
WATCH_MS = 6000      # the C target's own loop while attaching and instrumenting
# attach -> first event: `daemon PID` + `ctl PID instrument F` with the daemon started
# from scratch, the same forked by the resident process, and `daemon PID -f F` (one
# command, as Frida's attach-and-hook) forked by the resident process; then the plain
# commands as a user types them, with the resident started on demand: `daemon PID -f F`
# with none running (it starts one), the same again, `daemon PID` + `ctl PID instrument F`
FIRST_MODES = ("first", "first_resident", "first_resident_f", "first_ctl_f", "first_ctl_f_warm",
               "first_plain_cold", "first_plain_f", "first_plain_ctl")
PLAIN_MODES = ("first_plain_cold", "first_plain_f", "first_plain_ctl")
CTL = os.path.join(ROOT, "build", "bin", "madtrace-ctl")   # make native builds it


def stats(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    if not values:
        return "-"
    return f"{min(values) * scale:.{digits}f} / {statistics.median(values) * scale:.{digits}f}"


def ratios(out: dict, key: str, suffix: str = "") -> str:
    """min / median of out[key] / out["lat_untraced"], repeat by repeat (suffix
    "_p10": of the 10th percentiles, which a loaded machine moves less)."""
    return stats([a / b for a, b in zip(out[key + suffix], out["lat_untraced" + suffix])])


def sample(out: dict, key: str, latencies: list[float]) -> None:
    """A repeat's request latencies: their median in out[key], their 10th
    percentile in out[key + "_p10"]."""
    out[key].append(statistics.median(latencies))
    out[key + "_p10"].append(sorted(latencies)[len(latencies) // 10])


class Target:
    """tests/progs/bench_live, driven line by line."""

    def __init__(self):
        self.proc = subprocess.Popen([prog("bench_live", "O2-pie")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        assert self.proc.stdout.readline() == b"ready\n"
        self.pid = self.proc.pid

    def send(self, line: str) -> None:
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def reply(self) -> str:
        return self.proc.stdout.readline().decode()

    def calls(self, n: int) -> float:
        return self.checked_calls(n)[0]

    def checked_calls(self, n: int) -> tuple[float, int]:
        """(ns per call of the program's own loop, its checksum)."""
        self.send(f"calls {n}")
        match = re.search(r"checksum (\d+) ns_per_call ([\d.]+)", self.reply())
        return float(match.group(2)), int(match.group(1))

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()


class Madtrace:
    name = "madtrace"

    def __init__(self, tmp: str):
        # no resident started on demand, but in the plain modes (``on_demand``)
        self.env = dict(os.environ, PYTHONPATH=ROOT, XDG_RUNTIME_DIR=os.path.join(tmp, "run"),
                        MADTRACE_RESIDENT_IDLE="0")
        os.makedirs(self.env["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
        self.tmp = tmp
        self.directories: dict[int, str] = {}     # pid -> its session's trace

    def run(self, *args, check=True, client=MADTRACE, on_demand=False) -> subprocess.CompletedProcess:
        env = dict(self.env, MADTRACE_RESIDENT_IDLE="600") if on_demand else self.env
        result = subprocess.run([*client, *args], capture_output=True, env=env, timeout=300)
        if check and result.returncode != 0:
            raise RuntimeError(f"madtrace {' '.join(args)}: {result.stderr.decode()}")
        return result

    def attach(self, pid: int, *extra: str, client=MADTRACE, on_demand=False) -> str:
        out = tempfile.mkdtemp(prefix="t", dir=self.tmp)
        os.rmdir(out)                   # the daemon makes it (it never overwrites one)
        self.run("daemon", str(pid), "-o", out, *extra, client=client, on_demand=on_demand)
        self.directories[pid] = out
        return out

    def attach_and_instrument(self, pid: int, mode: str, spec: str) -> str:
        """FIRST_MODES: daemon + ctl instrument, or daemon -f SPEC (one command,
        with the Python client or madtrace-ctl)."""
        if mode == "first_resident_f":
            return self.attach(pid, "-f", spec)
        if mode in ("first_ctl_f", "first_ctl_f_warm"):
            return self.attach(pid, "-f", spec, client=[CTL])
        if mode in ("first_plain_cold", "first_plain_f"):
            return self.attach(pid, "-f", spec, on_demand=True)
        directory = self.attach(pid, on_demand=mode == "first_plain_ctl")
        self.instrument(pid, spec)
        return directory

    def instrument(self, pid: int, *specs: str) -> None:
        self.run("ctl", str(pid), "instrument", *specs)

    def status(self, pid: int) -> dict:
        return json.loads(self.run("ctl", str(pid), "status", "--json").stdout)

    def detach(self, pid: int) -> None:
        """The session ends, and its trace goes once its daemon is gone: each 6 s
        watch writes ~4 GB, and ~60 GB kept over a run filled the page cache and the
        disk (its third repeat: 72.8 ns per call against 27.1 and 23.7)."""
        daemon = tracer_of(pid)
        self.run("ctl", str(pid), "stop")
        deadline = time.monotonic() + 120
        while daemon and os.path.exists(f"/proc/{daemon}") and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(self.directories.pop(pid, ""), ignore_errors=True)

    @contextlib.contextmanager
    def resident(self, on: bool = True):
        """With the resident madtrace process running (daemons forked from it)."""
        if not on:
            yield
            return
        if on in ("on demand", "on demand, last"):     # started by the plain commands
            try:
                yield
            finally:
                if on == "on demand, last":
                    self.run("daemon", "--stop-resident", "-q")
                else:   # ready for the next mode (a user's next command comes later)
                    sock = os.path.join(self.env["XDG_RUNTIME_DIR"], "madtrace", "resident.sock")
                    deadline = time.monotonic() + 60
                    while not os.path.exists(sock) and time.monotonic() < deadline:
                        time.sleep(0.05)
            return
        self.run("daemon", "--resident", "-q")
        try:
            yield
        finally:
            self.run("daemon", "--stop-resident", "-q")


def mode_resident(mode: str):
    """How a FIRST_MODES mode has its resident: none, started by the bench, or
    started on demand by the plain commands."""
    if mode == "first":
        return False
    if mode in PLAIN_MODES:
        return "on demand, last" if mode == PLAIN_MODES[-1] else "on demand"
    return True


def tracer_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^TracerPid:\s+(\d+)", f.read(), re.M).group(1))


def quiet_disk() -> None:
    """The records of the runs before are on disk (the tracer's writer has them
    already: its ``status`` waits for that), so that a run's figure is its own."""
    os.sync()


def first_record(directory: str, started: float, timeout: float = 60) -> float:
    """Seconds from ``started`` until a record reached calls/ (polled every ms)."""
    calls = os.path.join(directory, "calls")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(os.path.getsize(os.path.join(calls, f)) for f in os.listdir(calls)):
                return time.perf_counter() - started
        except OSError:
            pass
        time.sleep(0.001)
    raise RuntimeError("no record")


def split_gaps(watched: str, windows: list) -> tuple[float, float]:
    """The program's pauses (bench_live's watch: each longer than 1 ms, START:LENGTH
    in ns of CLOCK_MONOTONIC) split by madtrace's stops (status stop_windows, s
    of the same clock): (the longest pause that overlaps a stop, the longest of
    the others: the machine's, e.g. another process on the CPU), in us."""
    during = other = 0.0
    for start, length in re.findall(r" (\d+):(\d+)", watched.split(" gaps", 1)[-1]):
        lo, hi = int(start) / 1e9, (int(start) + int(length)) / 1e9
        overlaps = any(lo < end and begin < hi for begin, end in windows)
        if overlaps:
            during = max(during, int(length) / 1e3)
        else:
            other = max(other, int(length) / 1e3)
    return during, other


def madtrace_c(tmp: str) -> dict:
    """attach -> first event (a daemon started from scratch, and forked by the
    resident process), longest pause, ns per call attached, drops (C target)."""
    tool = Madtrace(tmp)
    out: dict[str, list] = {"first": [], "first_resident": [], "first_resident_f": [],
                            "first_ctl_f": [], "first_ctl_f_warm": [], "first_plain_cold": [],
                            "first_plain_f": [], "first_plain_ctl": [], "pause": [], "ns": [],
                            "ns_notime": [], "stopped": [], "floor": [],
                            "pause_stops": [], "pause_other": [],
                            "drops": [], "missed": []}
    for _ in range(REPEATS):
        # the machine's floor: the longest pause of the same loop, untraced, now
        target = Target()
        target.send(f"watch {WATCH_MS}")
        out["floor"].append(float(re.search(r"longest_us ([\d.]+)", target.reply()).group(1)))
        target.close()
        for mode in FIRST_MODES:
            resident = mode_resident(mode)
            with tool.resident(resident):
                if mode.endswith("_warm"):      # the resident has seen the program once
                    warm = Target()
                    tool.attach_and_instrument(warm.pid, mode, "leaf")
                    tool.detach(warm.pid)
                    warm.close()
                target = Target()
                try:
                    target.send(f"watch {WATCH_MS}")   # the program measures its longest pause
                    time.sleep(0.3)
                    started = time.perf_counter()
                    directory = tool.attach_and_instrument(target.pid, mode, "leaf")
                    try:
                        out[mode].append(
                            first_record(directory, started, timeout=WATCH_MS / 1000))
                    except RuntimeError:  # the loop ended first (a machine too loaded): said
                        out["missed"].append(1)
                    watched = target.reply()
                    out["pause"].append(float(re.search(r"longest_us ([\d.]+)",
                                                        watched).group(1)))
                    # the tracer's account: the longest stop, attach (and -f) or instrument
                    status = tool.status(target.pid)
                    out["stopped"].append(max(status.get("attach_pause_ms") or 0,
                                              status["last_pause_ms"]))
                    during, other = split_gaps(watched, status["stop_windows"])
                    out["pause_stops"].append(during)
                    out["pause_other"].append(other)
                    if resident:
                        tool.detach(target.pid)
                        continue
                    quiet_disk()
                    out["ns"].append(target.calls(CALLS))
                    out["drops"].append(tool.status(target.pid)["dropped_events"])
                    tool.detach(target.pid)
                    directory = tool.attach(target.pid, "--no-time")
                    tool.instrument(target.pid, "leaf")
                    quiet_disk()
                    out["ns_notime"].append(target.calls(CALLS))
                    out["drops"].append(tool.status(target.pid)["dropped_events"])
                    tool.detach(target.pid)
                finally:
                    target.close()
    return out


def launched_c(tmp: str) -> dict:
    """ns per call launched, and untraced (the program's own loop)."""
    out: dict[str, list] = {"ns": [], "ns_notime": [], "untraced": []}
    for _ in range(REPEATS):
        for key, extra in (("ns", []), ("ns_notime", ["--no-time"])):
            quiet_disk()
            run = subprocess.run([*MADTRACE, "record", "-q", "--force", "-o",
                                  os.path.join(tmp, "launched"), "-f", "leaf", *extra, "--",
                                  prog("bench_live", "O2-pie")],
                                 input=f"calls {CALLS}\nquit\n".encode(), capture_output=True,
                                 env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
            out[key].append(float(re.search(rb"ns_per_call ([\d.]+)", run.stdout).group(1)))
        target = Target()
        out["untraced"].append(target.calls(CALLS))
        target.close()
    return out


class Server:
    def __init__(self, tmp: str):
        self.proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind",
                                      "127.0.0.1"], cwd=tmp, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.port = int(re.search(rb"port (\d+)", self.proc.stdout.readline()).group(1))
        self.pid = self.proc.pid
        with open(f"/proc/{self.pid}/maps") as f:
            lib = re.search(r"/(libpython[^/\s]*\.so[^/\s]*)$", f.read(), re.M)
        self.lib = lib.group(1) if lib else None

    def spec(self, pattern: str) -> str:
        return f"{self.lib}:{pattern}" if self.lib else pattern

    def latency(self, n: int = REQUESTS) -> list[float]:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=30) as reply:
                reply.read()
            times.append(time.perf_counter() - t0)
            time.sleep(0.02)
        return times

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def madtrace_server(tmp: str) -> dict:
    tool = Madtrace(tmp)
    out: dict[str, list] = {"first": [], "first_resident": [], "first_resident_f": [],
                            "first_ctl_f": [], "first_ctl_f_warm": [], "first_plain_cold": [],
                            "first_plain_f": [], "first_plain_ctl": [], "events_per_request": [],
                            "lat_untraced": [], "lat_attached": [],
                            "lat_untraced_p10": [],
                            "lat_attached_p10": [], "lat_instrumented_p10": [],
                            "lat_instrumented": [], "hook20": [], "hook20_pause": [],
                            "hook900": [], "hook900_pause": [], "functions900": [],
                            "attach_pause": []}
    for _ in range(REPEATS):
        server = Server(tmp)
        try:
            loaded = threading.Event()       # requests go on until the first record

            def load(server=server, loaded=loaded):
                while not loaded.is_set():
                    server.latency(1)
            threading.Thread(target=load, daemon=True).start()
            try:
                for mode in FIRST_MODES:
                    with tool.resident(mode_resident(mode)):
                        if mode.endswith("_warm"):  # the resident has seen the program once
                            tool.attach_and_instrument(server.pid, mode, server.spec("PyDict_New"))
                            tool.detach(server.pid)
                        started = time.perf_counter()
                        directory = tool.attach_and_instrument(server.pid, mode,
                                                               server.spec("PyDict_New"))
                        out[mode].append(first_record(directory, started))
                        tool.detach(server.pid)
            finally:
                loaded.set()
            # untraced right before the attach: the reference of the ratios (a loaded
            # machine drifts over the seconds of the first-event runs)
            sample(out, "lat_untraced", server.latency())
            tool.attach(server.pid)
            out["attach_pause"].append(tool.status(server.pid).get("attach_pause_ms") or 0)
            sample(out, "lat_attached", server.latency())
            t0 = time.perf_counter()
            tool.instrument(server.pid, server.spec("PyDict_*"))
            out["hook20"].append(time.perf_counter() - t0)
            status = tool.status(server.pid)
            out["hook20_pause"].append(status["last_pause_ms"] / 1000)
            sample(out, "lat_instrumented", server.latency())
            # ptrace stops per request while instrumented (the ring pool: none)
            events = tool.status(server.pid)["tracer_events"] - status["tracer_events"]
            out["events_per_request"].append(events / REQUESTS)
            t0 = time.perf_counter()
            result = tool.run("ctl", str(server.pid), "instrument", server.spec("Py[A-Z]*"),
                              "--json")
            out["hook900"].append(time.perf_counter() - t0)
            out["hook900_pause"].append(tool.status(server.pid)["last_pause_ms"] / 1000)
            out["functions900"].append(len(json.loads(result.stdout)["patched"]))
            tool.detach(server.pid)
        finally:
            server.close()
    return out


def other_c(tool, addresses_of) -> dict:
    """Frida / bpftrace on the C target: attach -> first event, longest pause, ns
    per call (checksum checked against an untraced run)."""
    out: dict[str, list] = {"first": [], "pause": [], "ns": [], "wrong": []}
    for _ in range(REPEATS):
        target = Target()
        try:
            reference = target.checked_calls(CALLS // 10)[1]
            target.send(f"watch {WATCH_MS}")
            time.sleep(0.3)
            first = threading.Event()
            started = time.perf_counter()
            tool.attach(target.pid, addresses_of(target.pid), first)
            if first.wait(60):
                out["first"].append(time.perf_counter() - started)
            pause = float(re.search(r"longest_us ([\d.]+)", target.reply()).group(1))
            if pause < 4e6:        # longer than the watch itself: the loop's clock was wrong
                out["pause"].append(pause)
            quiet_disk()           # as madtrace's runs (nothing of Frida's to write)
            ns, checksum = target.checked_calls(CALLS // 10)
            out["ns"].append(ns)
            out["wrong"].append(checksum != reference)
            tool.detach()
        finally:
            target.close()
    return out


def lib_path(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return re.search(r"(/\S*libpython[^/\s]*\.so[^/\s]*)$", f.read(), re.M).group(1)


def other_server(tool, how: str, tmp: str) -> dict:
    """Frida / bpftrace on http.server: hook the PyDict_* functions (s, until the
    tool says they are hooked), request latency untraced and hooked."""
    from live_others import functions_of, symbol_address
    out: dict[str, list] = {"hook20": [], "lat_untraced": [], "lat_hooked": [], "n": [],
                            "lat_untraced_p10": [], "lat_hooked_p10": []}
    for _ in range(REPEATS):
        server = Server(tmp)
        try:
            sample(out, "lat_untraced", server.latency())
            path = lib_path(server.pid)
            names = functions_of(path, "PyDict_*")
            out["n"].append(len(names))
            started = time.perf_counter()
            if how == "address":
                tool.attach(server.pid, [a for a in (symbol_address(server.pid, path, n)
                                                     for n in names) if a])
            else:
                tool.attach(server.pid, [f"{path}:PyDict_*"])
            out["hook20"].append(time.perf_counter() - started)
            sample(out, "lat_hooked", server.latency())
            tool.detach()
        finally:
            server.close()
    return out


def others(rows: list, tmp: str) -> None:
    """Frida (CModule, JS) and bpftrace beside madtrace, where they run here."""
    from live_others import Bpftrace, Frida, symbol_address
    path = prog("bench_live", "O2-pie")
    for make, how in ((lambda: Frida("cmodule"), "address"), (lambda: Frida("js"), "address"),
                      (Bpftrace, "probe")):
        try:
            tool = make()
        except Exception as exc:        # not installed, or cannot run here
            rows.append((f"{getattr(exc, 'name', '')}".strip() or "a tool", f"skipped: {exc}", ""))
            continue
        addresses_of = ((lambda pid: [symbol_address(pid, path, "leaf")]) if how == "address"
                        else (lambda pid: [f"{path}:leaf"]))
        try:
            got = other_c(tool, addresses_of)
        except Exception as exc:
            rows.append((tool.name, f"failed: {exc}", ""))
            continue
        wrong = " (WRONG RESULTS)" if any(got["wrong"]) else ""
        rows.append((f"{tool.name}: ns per call / first event (s) / longest pause (ms)",
                     f"{stats(got['ns'], digits=1)}{wrong}",
                     f"{stats(got['first'])} / {stats(got['pause'], 1e-3)}"))
        try:
            got = other_server(tool, how, tmp)
        except Exception as exc:
            rows.append((f"{tool.name}, http.server", f"failed: {exc}", ""))
            continue
        rows.append((f"{tool.name}: hook {max(got['n'])} PyDict_* (s) / latency untraced, "
                     "hooked (ms)", stats(got["hook20"]),
                     f"{stats(got['lat_untraced'], 1e3)}, {stats(got['lat_hooked'], 1e3)} "
                     f"({ratios(got, 'lat_hooked')} x, p10 {ratios(got, 'lat_hooked', '_p10')} x)"))


def main() -> int:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        c = madtrace_c(tmp)
        launched = launched_c(tmp)
        server = madtrace_server(tmp)
        rows = [
            ("ns per call, launched (the program's loop)", stats(launched["ns"]),
             f"--no-time {stats(launched['ns_notime'])}"),
            ("ns per call, attached", stats(c["ns"]), f"--no-time {stats(c['ns_notime'])}"),
            ("ns per call, untraced", stats(launched["untraced"]), ""),
            (f"drops, attached runs of {CALLS} calls (timed and --no-time)", max(c["drops"]), ""),
            ("attach -> first event, C program (s)", stats(c["first"]),
             f"resident {stats(c['first_resident'])}, -f {stats(c['first_resident_f'])}, "
             f"madtrace-ctl -f {stats(c['first_ctl_f'])}, warm {stats(c['first_ctl_f_warm'])}"
             + (f"; {len(c['missed'])} runs saw none within {WATCH_MS} ms" if c["missed"] else "")),
            ("attach -> first event, http.server PyDict_New (s)", stats(server["first"]),
             f"resident {stats(server['first_resident'])}, -f {stats(server['first_resident_f'])}, "
             f"madtrace-ctl -f {stats(server['first_ctl_f'])}, warm "
             f"{stats(server['first_ctl_f_warm'])}"),
            ("attach -> first event, plain commands, C program (s)",
             stats(c["first_plain_f"]),
             f"the first, starting the resident {stats(c['first_plain_cold'])}; daemon + ctl "
             f"{stats(c['first_plain_ctl'])}"),
            ("attach -> first event, plain commands, http.server (s)",
             stats(server["first_plain_f"]),
             f"the first, starting the resident {stats(server['first_plain_cold'])}; daemon + "
             f"ctl {stats(server['first_plain_ctl'])}"),
            ("longest pause attaching + instrumenting, C (ms)", stats(c["pause"], 1e-3),
             f"untraced (the floor) {stats(c['floor'], 1e-3)}"),
            ("  of it, pauses during madtrace's stops / the others (ms)",
             stats(c["pause_stops"], 1e-3), stats(c["pause_other"], 1e-3)),
            ("target stopped, attach or instrument, C (ms, tracer's account)",
             stats(c["stopped"]), ""),
            ("target stopped attaching http.server (ms)", stats(server["attach_pause"]), ""),
            ("instrument 20 PyDict_* (s), target stopped (ms)", stats(server["hook20"]),
             stats(server["hook20_pause"], 1e3)),
            (f"instrument ~{max(server['functions900'])} Py* (s), target stopped (ms)",
             stats(server["hook900"]), stats(server["hook900_pause"], 1e3)),
            ("http.server latency untraced (ms)", stats(server["lat_untraced"], 1e3), ""),
            ("http.server latency attached, nothing instrumented (ms)",
             stats(server["lat_attached"], 1e3),
             f"{ratios(server, 'lat_attached')} x untraced (p10 "
             f"{ratios(server, 'lat_attached', '_p10')} x)"),
            ("http.server latency, PyDict_* instrumented (ms)",
             stats(server["lat_instrumented"], 1e3),
             f"{ratios(server, 'lat_instrumented')} x untraced (p10 "
             f"{ratios(server, 'lat_instrumented', '_p10')} x); ptrace stops per request "
             f"{stats(server['events_per_request'])}"),
        ]
        others(rows, tmp)
    print(table(f"live sessions (min / median of {REPEATS})", rows,
                ("measurement", "madtrace", "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
