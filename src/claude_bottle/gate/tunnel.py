"""Relay bytes both ways between two streams until both sides are done or the pair goes idle."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

READ_SIZE = 256 * 1024


@dataclass
class Traffic:
    up: int = 0  # client -> upstream
    down: int = 0  # upstream -> client
    last_activity: float = field(default_factory=time.monotonic)


class TunnelIdle(TimeoutError):
    pass


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, traffic: Traffic, upward: bool
) -> None:
    while data := await reader.read(READ_SIZE):
        writer.write(data)
        if upward:
            traffic.up += len(data)
        else:
            traffic.down += len(data)
        traffic.last_activity = time.monotonic()
        await writer.drain()
    # Pass the half-close on: the other direction may still have bytes to deliver.
    if writer.can_write_eof() and not writer.is_closing():
        writer.write_eof()


async def _watch(pumps: tuple[asyncio.Task[None], asyncio.Task[None]], traffic: Traffic, idle: float) -> None:
    while True:
        await asyncio.wait(pumps, timeout=min(idle, 5.0))
        if all(p.done() for p in pumps):
            return
        if time.monotonic() - traffic.last_activity > idle:
            raise TunnelIdle(f"no traffic for {idle:g}s")


async def relay(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    traffic: Traffic,
    idle_timeout: float,
) -> None:
    """Run until both directions reach EOF. A reset or idle timeout on either side ends both."""
    async with asyncio.TaskGroup() as tg:
        up = tg.create_task(_pump(client[0], upstream[1], traffic, upward=True))
        down = tg.create_task(_pump(upstream[0], client[1], traffic, upward=False))
        tg.create_task(_watch((up, down), traffic, idle_timeout))
