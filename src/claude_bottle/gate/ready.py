"""The gate's one start-up announcement, and its one parser.

Once it listens, the gate prints one line on standard error::

    claude-bottle gate: ready {"api": "127.0.0.1:8480", "proxy": "127.0.0.1:8481",
                               "upstream": "https://api.anthropic.com", "ca": "<base64 DER>"}

(on one line): where its two listeners are, the upstream it forwards to, and its CA's certificate (public; the
key never leaves the gate's memory). The host's runtime, the tests and the benchmarks read it with
``parse_ready``; nothing else matches the gate's output. A gate image built before this line said
``claude-bottle gate: API on ...`` instead, and never says it: ``older_gate_said`` tells the host so.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from claude_bottle.errors import ConfigError
from claude_bottle.gate.settings import Endpoint, parse_listen

READY = "claude-bottle gate: ready "
OLDER_READY = "claude-bottle gate: API on "  # what a gate image built before the ready line said once it listened


@dataclass(frozen=True)
class Ready:
    """What a gate announced: where it listens, its upstream (``scheme://authority[/path]``), its CA (DER)."""

    api: Endpoint
    proxy: Endpoint
    upstream: str
    ca: bytes

    def line(self) -> str:
        """The announcement, one line without its newline."""
        fields = {"api": str(self.api), "proxy": str(self.proxy), "upstream": self.upstream,
                  "ca": base64.b64encode(self.ca).decode("ascii")}
        return READY + json.dumps(fields)

    def ca_pem(self) -> bytes | None:
        """The CA certificate as PEM, or None when the announced bytes are not a certificate."""
        from cryptography import x509  # a tenth of a second to import: only when the certificate is wanted
        from cryptography.hazmat.primitives import serialization

        try:
            certificate = x509.load_der_x509_certificate(self.ca)
        except ValueError:
            return None
        return certificate.public_bytes(serialization.Encoding.PEM)


def ready_said(output: bytes) -> bool:
    """Whether ``output`` holds a whole announcement line (its newline come), well-formed or not: a reader of
    a starting gate's output stops there."""
    return _whole_line_said(output, READY)


def older_gate_said(output: bytes) -> bool:
    """Whether ``output`` holds the whole line an older gate image (built before the ready line) said once it
    listened: such a gate is running but will never announce itself as this claude-bottle expects."""
    return _whole_line_said(output, OLDER_READY)


def _whole_line_said(output: bytes, prefix: str) -> bool:
    start = output.rfind(prefix.encode())
    return start >= 0 and output.find(b"\n", start) >= 0


def parse_ready(output: str) -> Ready | None:
    """The gate's announcement in ``output`` (its start-up lines), or None when there is none or it is not
    well-formed. The last one counts."""
    lines = [line for line in output.splitlines() if line.startswith(READY)]
    if not lines:
        return None
    try:
        fields = json.loads(lines[-1].removeprefix(READY))
        return Ready(api=parse_listen(fields["api"], "api"), proxy=parse_listen(fields["proxy"], "proxy"),
                     upstream=str(fields["upstream"]), ca=base64.b64decode(fields["ca"], validate=True))
    except (ValueError, KeyError, TypeError, binascii.Error, ConfigError):
        return None
