"""[[egress]] rules against what a lenient server makes of a request, on a gate on loopback (plain HTTP through
the proxy): HEAD routed as GET, a method override header or body field, a path override header, ';' segment
parameters, '..;', a trailing slash or '.' suffix, another letter case. Each refused request never reaches the
upstream whole."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator, Callable

import brotli
import pytest

from claude_bottle.gate.failures import Refused
from claude_bottle.gate.forward import Outbound
from claude_bottle.gate.inspection import request_rules
from claude_bottle.policy.hosts import Target
from claude_bottle.policy.rules import RequestPolicy, make_host_rules
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory, RunningGate
from tests.gate import test_request_filters
from tests.gate.test_api_streaming import Recording, body_received, request_end
from tests.gate.test_request_filters import PLAIN_HOST, absolute, plain_gate
from tests.helpers import eventually, exchange, parse_head, raw_server, read_all

pytestmark = pytest.mark.asyncio
plain = test_request_filters.plain  # the plain-HTTP server fixture


@pytest.mark.parametrize(("method", "path", "extra"), [
    ("GET", "/v1/models", "X-HTTP-Method-Override: DELETE\r\n"),
    ("GET", "/v1/models", "X-HTTP-Method: delete\r\n"),
    ("GET", "/v1/models", "X_Method_Override: PUT\r\n"),
    ("GET", "/v1/models?_method=DELETE", ""),
    ("GET", "/v1/models?%5Fmethod=DELETE", ""),
    ("GET", "/v1/admin;jsessionid=x", ""),
    ("GET", "/v1/x/..;/admin", ""),
    ("GET", "/v1/admin/", ""),
    ("GET", "/V1/ADMIN", ""),
    ("GET", "/v1/admin.json", ""),
    ("GET", "/v1/models", "X-Original-URL: /v1/admin\r\n"),
    ("GET", "/v1/models", "X_Rewrite_Url: /v1/Admin?x=1\r\n"),
    ("GET", "/v1/models", "X-Original-URL: http://example.com/v1/admin\r\n"),
], ids=["override", "x-http-method", "underscored", "query", "encoded-query", "semicolon", "dot-dot-semicolon", "trailing-slash",
        "case", "format-suffix", "original-url", "rewrite-url", "absolute-original-url"])
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


async def test_head_to_a_path_whose_get_is_denied_is_refused(make_gate: GateFactory, plain: StubUpstream) -> None:
    rules = (f"{PLAIN_HOST}:{plain.port} allow HEAD /**", f"{PLAIN_HOST}:{plain.port} deny GET /v1/admin")
    async with plain_gate(make_gate, plain.port, egress_rules=rules) as gate:
        answer = await exchange(gate.proxy, absolute("HEAD", plain.port, "/v1/admin"))
        refused = parse_head(answer)
        allowed = parse_head(await exchange(gate.proxy, absolute("HEAD", plain.port, "/v1/models")))
    assert refused[0] == 403 and refused[1]["x-deny-reason"].endswith("(HEAD, which servers route as GET)"), refused
    assert answer.endswith(b"\r\n\r\n")  # a refusal of HEAD is its head alone (a body there made it a reset)
    assert allowed[0] == 404  # the upstream's answer: it has no such route
    assert [(r.method, r.target) for r in plain.requests] == [("HEAD", "/v1/models")]


MULTIPART_TYPE = "Content-Type: multipart/form-data; boundary=b0und\r\n"


def multipart_field(name: str, value: str) -> bytes:
    return f'--b0und\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n--b0und--\r\n'.encode()


@pytest.mark.parametrize(("extra", "body"), [
    ("", b"_method=DELETE"),  # no Content-Type: Rack reads a POST's body as a form
    ("Content-Type: application/x-www-form-urlencoded\r\n", b"title=x&%5Fmethod=delete"),
    (MULTIPART_TYPE, multipart_field("_method", "DELETE")),
    ("Content-Type: application/json\r\n", b'{"title": "x", "_method": "DELETE"}'),
], ids=["no-content-type", "form", "multipart", "json"])
async def test_a_post_whose_body_names_another_method_is_judged_as_that_method(
        make_gate: GateFactory, plain: StubUpstream, extra: str, body: bytes) -> None:
    rules = (f"{PLAIN_HOST}:{plain.port} allow POST /v1/items", f"{PLAIN_HOST}:{plain.port} allow GET /**")
    async with plain_gate(make_gate, plain.port, egress_rules=rules) as gate:
        refused = parse_head(await exchange(gate.proxy, absolute("POST", plain.port, "/v1/items", body, extra)))
        allowed = [parse_head(await exchange(gate.proxy, absolute("POST", plain.port, "/v1/items", sent, kind)))
                   for kind, sent in (("Content-Type: application/x-www-form-urlencoded\r\n", b"_method=POST&a=1"),
                                      (MULTIPART_TYPE, multipart_field("title", "x")),
                                      ("Content-Type: text/plain\r\n", b"_method=DELETE"))]  # no framework reads it
        records = gate.records()
    assert refused[0] == 403, refused
    assert refused[1]["x-deny-reason"] == (
        f'DELETE matches no allow rule of [[egress]] {PLAIN_HOST}:{plain.port} (allowed: "POST /v1/items", '
        '"GET /**") (the method a method override names)')
    assert all("x-deny-reason" not in headers for _, headers in allowed)  # relayed: the stub's own answer
    assert [r.body for r in plain.requests] == [b"_method=POST&a=1", multipart_field("title", "x"), b"_method=DELETE"]
    assert [r["decision"] for r in records] == ["deny", "allow", "allow", "allow"]


@pytest.mark.parametrize(("coding", "encode"), [
    # (gzip without a time in its header: the body sent is compared with one compressed again)
    ("gzip", lambda data: gzip.compress(data, mtime=0)), ("deflate", zlib.compress), ("br", brotli.compress),
    ("gzip, br", lambda data: brotli.compress(gzip.compress(data, mtime=0))),
], ids=["gzip", "deflate", "br", "gzip-then-br"])
async def test_an_encoded_body_is_judged_as_the_server_decodes_it(make_gate: GateFactory, plain: StubUpstream,
                                                                  coding: str, encode: Callable[[bytes], bytes]
                                                                  ) -> None:
    """Express's body parsers inflate a body before method-override reads its ``_method``: the field is read from
    the decoded body as well as from the bytes as sent."""
    rules = (f"{PLAIN_HOST}:{plain.port} allow POST /v1/items",)
    form = "Content-Type: application/x-www-form-urlencoded\r\n"
    sent = [("form", form, b"title=x&_method=DELETE"), ("json", "Content-Type: application/json\r\n",
                                                          b'{"title": "x", "_method": "PUT"}'),
            ("allowed", form, b"title=x&_method=POST")]
    async with plain_gate(make_gate, plain.port, egress_rules=rules) as gate:
        answers = {name: parse_head(await exchange(gate.proxy, absolute(
            "POST", plain.port, "/v1/items", encode(body), kind + f"Content-Encoding: {coding}\r\n")))
            for name, kind, body in sent}
        corrupt = parse_head(await exchange(gate.proxy, absolute("POST", plain.port, "/v1/items", b"_method=PUT",
                                                                 form + f"Content-Encoding: {coding}\r\n")))
    assert answers["form"][0] == answers["json"][0] == 403, answers
    assert answers["form"][1]["x-deny-reason"].startswith("DELETE matches no allow rule of [[egress]]")
    assert answers["json"][1]["x-deny-reason"].startswith("PUT matches no allow rule of [[egress]]")
    assert "x-deny-reason" not in answers["allowed"][1]  # relayed: the stub's own answer
    assert corrupt[0] == 400 and "x-deny-reason" in corrupt[1], corrupt  # not decodable: refused, not judged
    assert [r.body for r in plain.requests] == [encode(b"title=x&_method=POST")]


async def test_a_multipart_body_of_more_parts_than_frameworks_read_is_refused(make_gate: GateFactory,
                                                                               plain: StubUpstream) -> None:
    body = b"".join(b'--b0und\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n' for _ in range(5000))
    rules = (f"{PLAIN_HOST}:{plain.port} allow POST /v1/items",)
    async with plain_gate(make_gate, plain.port, egress_rules=rules) as gate:
        refused = parse_head(await exchange(gate.proxy, absolute("POST", plain.port, "/v1/items",
                                                                 body + b"--b0und--\r\n", MULTIPART_TYPE)))
    assert refused[0] == 400
    assert refused[1]["x-deny-reason"].startswith("a multipart body of more than 4096 parts: its _method fields")
    assert plain.requests == []


async def streamed_form(gate: RunningGate, port: int, body: bytes) -> bytes:
    """POST ``body`` as a form in pieces (the gate sees it arrive, not one block) and read the answer."""
    reader, writer = await asyncio.open_connection(gate.proxy.host, gate.proxy.port)
    writer.write(absolute("POST", port, "/v1/items", extra="Content-Type: application/x-www-form-urlencoded\r\n")
                 .replace(b"Content-Length: 0", b"Content-Length: %d" % len(body)))
    for at in range(0, len(body), 40_000):
        writer.write(body[at : at + 40_000])
        await writer.drain()
        await asyncio.sleep(0.005)
    response = await read_all(reader, 3)
    writer.close()
    return response


async def test_a_streamed_form_is_judged_whole_before_its_end_goes_upstream(make_gate: GateFactory) -> None:
    """A form too long to arrive with its head goes upstream as it arrives, less its last piece, held back until
    the whole body's _method fields are judged: the refused one never completes at the server."""
    upstream = Recording()
    filler = b"title=" + b"x" * 200_000
    async with raw_server(upstream.serve) as origin:
        rules = (f"{PLAIN_HOST}:{origin.port} allow POST /v1/items", f"{PLAIN_HOST}:{origin.port} allow GET /**")
        async with plain_gate(make_gate, origin.port, egress_rules=rules) as gate:
            refused = await streamed_form(gate, origin.port, filler + b"&_method=DELETE")
            await eventually(lambda: upstream.ended, what="the refused request's upstream connection to end")
            allowed = await streamed_form(gate, origin.port, filler + b"&_method=POST")
            records = gate.records()
    assert refused.startswith(b"HTTP/1.1 403 ") and b"(the method a method override names)" in refused
    first = upstream.received[0]
    assert request_end(first) is None, "the upstream received the refused request whole"
    assert 0 < len(body_received(first)) < len(filler)
    assert allowed.startswith(b"HTTP/1.1 200 ")
    assert [body_received(r) for r in upstream.requests] == [filler + b"&_method=POST"]
    assert [(r["decision"], r["status"]) for r in records] == [("deny", 403), ("allow", 200)]


async def pieces_of(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


@pytest.mark.parametrize(("last", "verdict"), [(b"&_method=DELETE", 403), (b"&_method=POST", None),
                                               (b"x" * 100, 413)], ids=["refused", "allowed", "too-large"])
async def test_a_streamed_forms_last_piece_waits_for_the_verdict_on_the_whole(last: bytes, verdict: int | None
                                                                              ) -> None:
    """The rules' filter alone (DLP, after it in the gate, holds back a tail of its own): every piece but the
    last goes on as it arrives; the last only once the whole body's _method fields passed."""
    policy = RequestPolicy((make_host_rules("forms.example", allow=["POST /v1/items"]),))
    request = Outbound(b"POST", b"/v1/items", [(b"content-type", b"application/x-www-form-urlencoded")],
                       pieces_of(b"a=1&", b"b=2", last), None, True)
    await request_rules(policy, Target("forms.example", 80), 50)(request)
    body, passed, refused = request.body, list[bytes](), None
    assert not isinstance(body, bytes)
    try:
        async for piece in body:
            passed.append(piece)
    except Refused as stop:
        refused = stop.status
    assert refused == verdict
    if verdict is None:
        assert passed == [b"a=1&", b"b=2", last]
        (allowed,) = request.decided
        assert allowed.reason == 'POST allowed by [[egress]] forms.example rule "allow POST /v1/items"'
    else:
        assert passed == ([b"a=1&"] if verdict == 413 else [b"a=1&", b"b=2"])
        assert not request.decided
