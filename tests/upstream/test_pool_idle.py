"""Which idle connection ``OriginPool`` hands out, over real loopback connections.

Most recently used first, except one idle past ``REFRESH_SHARE`` of the keep-alive expiry,
taken first so that it is used again before it expires. Time is the connections' own
``idle_since``, moved back by the test (what the loop's clock would do while they sit idle).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from router.origin import Origin
from router.upstream import client
from router.upstream.client import Connection, OriginPool

pytestmark = pytest.mark.anyio

EXPIRY = 4.0


@pytest.fixture
async def listening() -> AsyncIterator[str]:
    """A server that accepts connections and holds them (no request is sent on them here)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    srv = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        srv.close()
        await srv.wait_closed()


async def pool_of(url: str, idle: int) -> tuple[OriginPool, list[Connection]]:
    """A pool with ``idle`` connections put back in order (the first the oldest)."""
    pool = OriginPool(Origin.parse(url), max_connections=64, max_idle=64, keepalive_expiry=EXPIRY)
    conns = [await pool._connect(2.0) for _ in range(idle)]
    for conn in conns:
        pool.put_back(conn)
    return pool, conns


def age(pool: OriginPool, seconds: float) -> None:
    """Every idle connection has been idle ``seconds`` longer."""
    for conn in list(pool._idle):
        conn.idle_since -= seconds


def use(pool: OriginPool, count: int) -> list[Connection]:
    """Take ``count`` idle connections (fewer if the pool runs out), then put them back."""
    taken = []
    for _ in range(count):
        conn = pool.take_idle()
        if conn is None:
            break
        taken.append(conn)
    for conn in taken:
        pool.put_back(conn)
    return taken


async def test_the_most_recent_is_taken_while_the_oldest_is_fresh(listening: str) -> None:
    pool, conns = await pool_of(listening, 3)
    try:
        age(pool, EXPIRY * 0.4)  # (not past the share)
        assert pool.take_idle() is conns[-1]
    finally:
        pool.close()


async def test_one_idle_past_the_share_is_taken_first(listening: str) -> None:
    pool, conns = await pool_of(listening, 3)
    try:
        conns[0].idle_since -= EXPIRY * 0.6
        assert pool.take_idle() is conns[0]
        assert pool.take_idle() is conns[-1]  # (then most recent first again)
        assert pool.idle_connections == 1 and pool.open_connections == 3
    finally:
        pool.close()


async def test_expired_ones_are_closed_as_they_are_met(listening: str) -> None:
    pool, conns = await pool_of(listening, 4)
    try:
        conns[0].idle_since -= EXPIRY + 1
        conns[1].idle_since -= EXPIRY
        conns[2].idle_since -= EXPIRY * 0.75
        assert pool.take_idle() is conns[2]  # the oldest one not expired
        assert pool.open_connections == 2 and pool.idle_connections == 1  # (two closed)
    finally:
        pool.close()


@pytest.mark.parametrize("share", [client.REFRESH_SHARE, None])
async def test_a_lull_does_not_let_the_connections_a_wave_needs_expire(
    listening: str, share: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tail.py's spike: 8 connections for a wave, then 2 at a time for 5 s (a step of 0.25 s
    each), then a wave of 8 again. Taken in turn, all 8 are still there for it; most recent
    first (share None), 6 sat out the lull, expired, and the wave must open them again."""
    monkeypatch.setattr(client, "REFRESH_SHARE", share)
    pool, _ = await pool_of(listening, 8)
    try:
        for _ in range(20):
            assert len(use(pool, 2)) == 2
            age(pool, 0.25)
        found = len(use(pool, 8))
        assert found == (8 if share is not None else 2)
        assert pool.open_connections == found  # (the expired ones closed as they were met)
    finally:
        pool.close()
