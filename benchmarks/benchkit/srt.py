"""sandbox-runtime's HTTP proxy (the one Anthropic ships in ``@anthropic-ai/sandbox-runtime``) as a
loopback subprocess, via benchmarks/srt_proxy.mjs. Install it with

    npm install --prefix /opt/srt @anthropic-ai/sandbox-runtime        # needs node >= 20.11

and pass ``--srt /opt/srt/node_modules/@anthropic-ai/sandbox-runtime`` (the default when present)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from .core import HERE, LOOPBACK, BenchError, Child, Children

INSTALL = "npm install --prefix /opt/srt @anthropic-ai/sandbox-runtime (node >= 20.11)"
CANDIDATES = (Path("/opt/srt/node_modules/@anthropic-ai/sandbox-runtime"),
              Path("/tmp/srt-install/node_modules/@anthropic-ai/sandbox-runtime"))


def default_package() -> str:
    """The first installed candidate (the first one when none is), for ``--srt``'s default."""
    return str(next((p for p in CANDIDATES if p.is_dir()), CANDIDATES[0]))


def missing(package: Path) -> str | None:
    """Why the proxy cannot run from ``package``, or None when it can."""
    if shutil.which("node") is None:
        return f"node not found; then {INSTALL}"
    if not (package / "dist" / "sandbox" / "http-proxy.js").is_file():
        return f"sandbox-runtime not installed in {package}: {INSTALL}, and --srt DIR/node_modules/" \
               "@anthropic-ai/sandbox-runtime"
    return None


def version(package: Path) -> str | None:
    try:
        return str(json.loads((package / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def start_proxy(children: Children, name: str, package: Path, allowed_host: str, allowed_port: int,
                upstream_ca: Path | None, terminate: bool) -> tuple[Child, tuple[str, int], Path | None]:
    """Start the proxy allowing ``allowed_host:allowed_port`` only; (child, its address, its CA when it
    terminates TLS)."""
    if why := missing(package):
        raise BenchError(why)
    node = shutil.which("node") or "node"
    child = children.start(name, [node, str(HERE / "srt_proxy.mjs"), str(package), allowed_host,
                                  str(allowed_port), str(upstream_ca) if upstream_ca else "-",
                                  "terminate" if terminate else "opaque"], stdin_pipe=True)
    m = child.wait_for_line(re.compile(r'^\{"port":(\d+),"caCertPath":(null|"[^"]*")\}', re.MULTILINE), 30)
    ca = json.loads(m[2])
    return child, (LOOPBACK, int(m[1])), Path(ca) if ca else None
