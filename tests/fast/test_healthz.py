"""`GET /healthz` is public and costs a database and a Temporal round trip (issue 36): its
answer is reused for `HEALTH_SECONDS`, so a caller in a loop, or many at once, cost one
check per second, not one per request. Counted on the pool the relay's app is given."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import httpx

from inboxcrm.ingress import app as relay_app
from inboxcrm.platform.config import Settings
from inboxcrm.stack.processes import free_port


class CountingPool:
    """A pool whose connections answer the health statement, counting the round trips."""

    def __init__(self) -> None:
        self.round_trips = 0

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        pool = self

        class Conn:
            async def fetchval(self, sql: str, *args: object) -> object:
                pool.round_trips += 1
                await asyncio.sleep(0.05)  # the answer takes a while: callers pile up
                return True

        yield Conn()


async def test_healthz_costs_one_store_round_trip_per_second_not_per_call() -> None:
    settings = Settings(env="local", temporal_address=f"127.0.0.1:{free_port()}")
    app = relay_app.create_app(settings)
    pool = CountingPool()
    app.state.ingestor = SimpleNamespace(pool=pool)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://relay") as client:
        answers = await asyncio.gather(*(client.get("/healthz") for _ in range(20)))
        assert {a.json()["database"] for a in answers} == {True}
        assert {a.json()["temporal"] for a in answers} == {False}  # nothing listens there
        assert pool.round_trips == 1
        for _ in range(5):
            await client.get("/healthz")
        assert pool.round_trips == 1
        with mock.patch.object(relay_app, "HEALTH_SECONDS", 0.0):
            await client.get("/healthz")  # the answer is older than the window: checked
        assert pool.round_trips == 2
