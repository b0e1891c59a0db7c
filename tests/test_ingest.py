"""The relay's ingest statement under concurrent redeliveries, on a real PostgreSQL database
of its own: many connections insert the same delivery at the same moment; exactly one
stores it, the others see a duplicate, and none fails. (Before the fix, the workflow-ID
unique index, not named in ON CONFLICT, raised for some of them and the relay answered 503.)"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from inboxcrm.schemas.models import inbound_workflow_id
from inboxcrm.stack import postgres
from inboxcrm.store.events import find_event, insert_event
from inboxcrm.store.migrate import apply_migrations

CONCURRENT = 8
DELIVERIES = 40


@pytest.fixture(scope="module")
async def pool(postgres_server_url: str) -> AsyncIterator[asyncpg.Pool]:
    url = await postgres.create_database(postgres_server_url, "inboxcrm_ingest")
    await apply_migrations(url)
    created = await asyncpg.create_pool(url, min_size=CONCURRENT, max_size=CONCURRENT)
    yield created
    await created.close()
    await postgres.drop_database(postgres_server_url, url)


async def _ingest(pool: asyncpg.Pool, delivery_id: str, start: asyncio.Event) -> bool:
    """What the relay does per request; True when this request stored the delivery."""
    key = {"tenant": "acme", "source": "postmark", "mailbox": "sales@acme.test",
           "delivery_id": delivery_id}
    async with pool.acquire() as conn:
        await start.wait()
        row = await insert_event(
            conn, **key, workflow_id=inbound_workflow_id(*key.values()), raw=b"raw",
            content_sha256="sha", size_bytes=3, actor="relay:postmark",
            provider_event=b"{}", provider_event_type="application/json")
        row = row or await find_event(conn, **key)
    assert row is not None
    return bool(row.get("new"))


async def test_concurrent_redeliveries_store_once_and_never_fail(pool: asyncpg.Pool) -> None:
    failures: list[BaseException] = []
    for _ in range(DELIVERIES):
        delivery_id = f"race-{uuid.uuid4().hex}"
        start = asyncio.Event()
        requests = [asyncio.create_task(_ingest(pool, delivery_id, start))
                    for _ in range(CONCURRENT)]
        await asyncio.sleep(0.01)  # every request holds its connection, then all go at once
        start.set()
        results = await asyncio.gather(*requests, return_exceptions=True)
        failures += [r for r in results if isinstance(r, BaseException)]
        assert [r for r in results if r is True] == [True], results
        stored = await pool.fetchval(
            "SELECT count(*) FROM inbound_events WHERE delivery_id = $1", delivery_id)
        received = await pool.fetchval(
            "SELECT count(*) FROM audit_log a JOIN inbound_events e USING (event_id) "
            "WHERE e.delivery_id = $1 AND a.action = 'received'", delivery_id)
        kept = await pool.fetchval(
            "SELECT count(*) FROM provider_events p JOIN inbound_events e USING (event_id) "
            "WHERE e.delivery_id = $1", delivery_id)
        assert (stored, received, kept) == (1, 1, 1)
    assert failures == []
