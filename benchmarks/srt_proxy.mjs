// sandbox-runtime's HTTP proxy on its own, on loopback, for the benchmarks (benchkit/srt.py).
//
//   node benchmarks/srt_proxy.mjs PACKAGE_DIR ALLOWED_HOST ALLOWED_PORT ORIGIN_CA_PEM (terminate|opaque)
//
// PACKAGE_DIR is node_modules/@anthropic-ai/sandbox-runtime of an `npm install`. The proxy is the one
// SandboxManager starts (createHttpProxyServer), with the host allowlist as its filter and, for
// "terminate", the in-process TLS termination SandboxManager enables with network.tlsTerminate: an ephemeral
// CA (createMitmCA, as SandboxManager makes it) and the origin's CA trusted for the upstream leg (ORIGIN_CA_PEM
// "-": none, for opaque tunnels only). Prints one
// JSON line: {"port": ..., "caCertPath": ...}. Exits when its standard input closes.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [packageDir, allowedHost, allowedPort, originCa, mode] = process.argv.slice(2);
const load = (file) => import(pathToFileURL(join(packageDir, "dist", "sandbox", file)).href);
const { createHttpProxyServer } = await load("http-proxy.js");
const { createMitmCA } = await load("mitm-ca.js");

const mitmCA = mode === "terminate" ? createMitmCA({}) : undefined;
const server = createHttpProxyServer({
  filter: (port, host) => host === allowedHost && port === Number(allowedPort),
  mitmCA,
  tlsTerminateUpstreamCA: originCa === "-" ? undefined : readFileSync(originCa),
});
server.listen(0, "127.0.0.1", () => {
  console.log(JSON.stringify({ port: server.address().port, caCertPath: mitmCA ? mitmCA.certPath : null }));
});
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
