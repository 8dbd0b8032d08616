"""Frida and bpftrace, driven as bench_live.py measures madtrace (bench only:
frida is in the bench extra, bpftrace a Debian package; each is skipped, with
the reason, where it does not run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time

FRIDA_CMODULE = r"""
const counter = Memory.alloc(8);
const cm = new CModule(`
#include <gum/guminterceptor.h>
extern volatile long counter;
void onEnter (GumInvocationContext * ic) { counter++; }
void onLeave (GumInvocationContext * ic) { counter++; }
`, { counter });
for (const a of ADDRESSES) Interceptor.attach(ptr(a), cm);
send("hooked " + counter);
"""

FRIDA_JS = r"""
let n = 0, told = false;
for (const a of ADDRESSES) Interceptor.attach(ptr(a), {
    onEnter() { n++; if (!told) { told = true; send("first"); } },
    onLeave() { n++; }
});
send("hooked");
"""


def symbol_address(pid: int, path: str, name: str) -> int | None:
    """Absolute address of function ``name`` of the mapped file ``path`` (nm, load bias)."""
    out = subprocess.run(["nm", "--defined-only", path], capture_output=True, text=True).stdout
    if not re.search(rf" {re.escape(name)}$", out, re.M):
        out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True).stdout
    match = re.search(rf"^([0-9a-f]+) [TtWi] {re.escape(name)}$", out, re.M)
    if not match:
        return None
    rel = int(match.group(1), 16)
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and os.path.realpath(fields[5]) == os.path.realpath(path) \
                    and fields[2] == "00000000":
                return int(fields[0].split("-")[0], 16) + rel
    return None


def functions_of(path: str, pattern: str) -> list[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True).stdout
    regex = re.compile("^" + pattern.replace("*", ".*") + "$")
    return sorted({m.group(1) for m in re.finditer(r"^[0-9a-f]+ T (\S+)$", out, re.M)
                   if regex.match(m.group(1))})


class Frida:
    def __init__(self, kind: str):
        import frida  # noqa: F401  (bench extra)
        self.kind = kind            # "cmodule" or "js"
        self.name = f"Frida {'CModule' if kind == 'cmodule' else 'JS'}"
        self.session = None

    def attach(self, pid: int, addresses: list[int], first: threading.Event | None = None) -> None:
        import frida
        source = (FRIDA_CMODULE if self.kind == "cmodule" else FRIDA_JS).replace(
            "ADDRESSES", "[" + ",".join(f"'{a:#x}'" for a in addresses) + "]")
        hooked = threading.Event()

        errors = []

        def on_message(message, data):
            payload = message.get("payload") or ""
            if message.get("type") == "error":
                errors.append(message.get("description"))
                hooked.set()
            elif payload.startswith("hooked"):
                if self.kind == "cmodule":      # the counter's address: polled for the first event
                    self.counter = int(payload.split()[1], 16)
                hooked.set()
            elif payload == "first" and first is not None:
                first.set()
        self.session = frida.attach(pid)
        script = self.session.create_script(source)
        script.on("message", on_message)
        script.load()
        hooked.wait(60)
        if errors:
            raise RuntimeError(f"{self.name}: {errors[0]}")
        self.script = script
        if first is not None and self.kind == "cmodule":
            threading.Thread(target=self._watch_counter, args=(pid, first), daemon=True).start()

    def _watch_counter(self, pid: int, first: threading.Event) -> None:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            for _ in range(60000):
                mem.seek(self.counter)
                if int.from_bytes(mem.read(8), "little"):
                    first.set()
                    return
                time.sleep(0.001)

    def detach(self) -> None:
        if self.session is not None:
            self.session.detach()
            self.session = None


class Bpftrace:
    name = "bpftrace"

    def __init__(self):
        if shutil.which("bpftrace") is None:
            raise RuntimeError("bpftrace is not installed")
        self.proc = None

    def attach(self, pid: int, probes: list[str], first: threading.Event | None = None) -> None:
        once = 'if (@once == 0) { @once = 1; printf("first\\n"); } ' if first else ""
        body = " ".join(f"uprobe:{p} {{ @c = count(); {once}}} uretprobe:{p} {{ @r = count(); }}"
                        for p in probes)
        program = "BEGIN { printf(\"hooked\\n\"); } " + body
        self.proc = subprocess.Popen(["bpftrace", "-p", str(pid), "-e", program],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        hooked = threading.Event()

        def reader():
            for line in self.proc.stdout:
                if line.startswith(b"hooked"):
                    hooked.set()
                elif line.startswith(b"first") and first is not None:
                    first.set()
        threading.Thread(target=reader, daemon=True).start()
        hooked.wait(120)

    def detach(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
