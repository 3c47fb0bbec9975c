"""Name resolution for the egress proxy, behind a seam so tests can make names resolve anywhere."""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol

from claude_bottle.policy.addresses import IPAddress, parse_ip_literal


class ResolveError(Exception):
    pass


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """Every address of ``host``, in the order to try them. Raises ResolveError."""
        ...


class SystemResolver:
    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        except (socket.gaierror, UnicodeError) as exc:
            raise ResolveError(f"cannot resolve {host}: {exc}") from None
        addresses: list[IPAddress] = []
        for *_, sockaddr in infos:
            ip = parse_ip_literal(str(sockaddr[0]))
            if ip is not None and ip not in addresses:
                addresses.append(ip)
        if not addresses:
            raise ResolveError(f"{host} has no addresses")
        return addresses


class StaticResolver:
    """Answers from a table, and records each question: the fake for tests. Change the table to rebind."""

    def __init__(self, table: dict[str, list[IPAddress]]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        self.calls.append(host)
        try:
            return list(self.table[host])
        except KeyError:
            raise ResolveError(f"cannot resolve {host}: no such name") from None
