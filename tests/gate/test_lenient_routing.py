"""[[egress]] rules against what a lenient server makes of a request, on a gate on loopback (plain HTTP through
the proxy): a method override header, ';' segment parameters, '..;', a trailing slash, another letter case.
Each refused request never reaches the upstream."""

from __future__ import annotations

import pytest

from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory
from tests.gate import test_request_filters
from tests.gate.test_request_filters import PLAIN_HOST, absolute, plain_gate
from tests.helpers import exchange, parse_head

pytestmark = pytest.mark.asyncio
plain = test_request_filters.plain  # the plain-HTTP server fixture


@pytest.mark.parametrize(("method", "path", "extra"), [
    ("GET", "/v1/models", "X-HTTP-Method-Override: DELETE\r\n"),
    ("GET", "/v1/models", "X-HTTP-Method: delete\r\n"),
    ("GET", "/v1/models", "X_Method_Override: PUT\r\n"),
    ("GET", "/v1/models?_method=DELETE", ""),
    ("GET", "/v1/admin;jsessionid=x", ""),
    ("GET", "/v1/x/..;/admin", ""),
    ("GET", "/v1/admin/", ""),
    ("GET", "/V1/ADMIN", ""),
], ids=["override", "x-http-method", "underscored", "query", "semicolon", "dot-dot-semicolon", "trailing-slash",
        "case"])
async def test_a_request_a_lenient_server_would_route_past_the_rules_is_refused(
        make_gate: GateFactory, plain: StubUpstream, method: str, path: str, extra: str) -> None:
    rules = (f"{PLAIN_HOST}:{plain.port} allow GET /**", f"{PLAIN_HOST}:{plain.port} deny * /v1/admin")
    async with plain_gate(make_gate, plain.port, egress_rules=rules) as gate:
        refused = parse_head(await exchange(gate.proxy, absolute(method, plain.port, path, extra=extra)))
        allowed = parse_head(await exchange(gate.proxy, absolute("GET", plain.port, "/v1/models",
                                                                 extra="X-HTTP-Method-Override: GET\r\n")))
    assert refused[0] in (400, 403), refused
    assert allowed[0] == 200
    assert [r.target for r in plain.requests] == ["/v1/models"]
