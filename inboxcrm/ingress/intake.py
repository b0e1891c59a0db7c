"""Intake shared by every inbound source: the delivery a source hands over (`Delivery`), the
one ingest path every push route and every pull source calls (`Intake.ingest`), the ledger
insert with its workflow start under it (the `Ingestor`), the sweeper that heals a failed
start, and the answers of section 10 of `docs/architecture.md`.

Two guards with two lifetimes: the `inbound_events` unique key answers redeliveries for as
long as the row exists (months after Temporal forgot the workflow); the workflow ID
(`USE_EXISTING` / `REJECT_DUPLICATE`) stops concurrent starts. A crash or a Temporal outage
between the insert and the start is healed by the sweeper, never by a second insert.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

import asyncpg
from fastapi.responses import JSONResponse
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from inboxcrm.adapters.imap import message_id_of
from inboxcrm.domain.policy import current_policies, tenant_priority
from inboxcrm.ingress.admission import Admission
from inboxcrm.ingress.metrics import RelayMetrics
from inboxcrm.platform import temporal
from inboxcrm.platform.codec import tenant_of_workflow
from inboxcrm.platform.config import Settings
from inboxcrm.platform.conflicts import ConflictKind
from inboxcrm.schemas.contract import WORKFLOW_TYPE, start_search_attributes
from inboxcrm.schemas.models import InboundEmailInput, inbound_workflow_id
from inboxcrm.store import audit, copies, events

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

log = logging.getLogger("inboxcrm.ingress")

START_RPC_TIMEOUT = timedelta(seconds=5)
# A full pool answers 503 (the provider redelivers) instead of queueing requests forever.
POOL_TIMEOUT_SECONDS = 5.0
DELIVERY_ID = re.compile(r"^[\x21-\x7e]{1,255}$")  # printable ASCII, no spaces


class BadRequest(Exception):
    """Malformed input: answered 422 with this (payload-free) message."""


@dataclass(frozen=True)
class ProviderEvent:
    """What the provider posted, as it posted it (the MIME is rebuilt from it)."""

    content_type: str
    body: bytes


@dataclass(frozen=True)
class Delivery:
    """What a source hands to the ingest path, push route or mailbox watcher alike: the
    tenant (decided from authenticated data only), the source's name (schemas.sources), the
    tenant's mailbox, the delivery ID (immutable: the same message always gets the same one,
    so a redelivery is answered `duplicate`), the raw RFC 5322 bytes, and when the source
    received it (a watcher: the mailbox's arrival time; a push route: now)."""

    tenant: str
    source: str
    mailbox: str
    delivery_id: str
    raw: bytes
    received_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    # The provider's own event where the raw message was rebuilt from it (Postmark's JSON,
    # Mailgun's form as JSON), stored next to it as evidence of what was received.
    provider_event: ProviderEvent | None = None

    @property
    def workflow_id(self) -> str:
        return inbound_workflow_id(self.tenant, self.source, self.mailbox, self.delivery_id)


@dataclass(frozen=True)
class IngestResult:
    status: str          # accepted | duplicate | copy | unavailable | ledger_unavailable
    workflow_id: str
    state: str
    # A duplicate a concurrent request stored first (the unique key answered it, not our
    # snapshot): counted as `inboxcrm_unique_conflicts_total{kind="intake_delivery"}`.
    raced: bool = False

    @property
    def stored(self) -> bool:
        """The delivery is in the ledger (its workflow runs, or the sweeper starts it): a
        mailbox watcher may move its cursor past it; otherwise it must offer it again."""
        return self.status != "ledger_unavailable"


class TemporalHandle:
    """A Temporal client that may not exist yet: the relay keeps accepting (and storing)
    deliveries while Temporal is down, and connects when it is back."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client: Client | None = None
        self._lock = asyncio.Lock()
        # Which namespace each tenant's workflows live in (docs/architecture.md §7,
        # Namespaces): one connection, one Client per namespace on it.
        self.namespaces = temporal.tenant_namespaces(settings)
        self._in: dict[str, Client] = {}

    async def get(self, tenant: str | None = None) -> Client:
        """The client of `tenant`'s namespace (None: the shared namespace)."""
        return self._of(await self._shared(), self.namespaces.of(tenant))

    async def for_workflow(self, workflow_id: str) -> Client:
        """The client of the namespace the workflow lives in (its ID names the tenant)."""
        return await self.get(tenant_of_workflow(workflow_id))

    async def every_namespace(self) -> list[Client]:
        """A client per namespace the tenants use, the shared one first."""
        shared = await self._shared()
        return [self._of(shared, namespace)
                for namespace in self.namespaces.served(current_policies())]

    def _of(self, shared: Client, namespace: str) -> Client:
        client = self._in.get(namespace)
        if client is None:
            client = self._in[namespace] = temporal.in_namespace(shared, namespace)
        return client

    async def _shared(self) -> Client:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                self._client = await asyncio.wait_for(temporal.connect(self._settings), 5)
            return self._client


class Ingestor:
    """Ledger insert + workflow start, shared by every inbound source and the sweeper."""

    def __init__(self, pool: asyncpg.Pool, temporal_handle: TemporalHandle,
                 task_queue: str) -> None:
        self.pool = pool
        self.temporal = temporal_handle
        self.task_queue = task_queue

    async def ingest(self, delivery: Delivery) -> IngestResult:
        digest = hashlib.sha256(delivery.raw).hexdigest()
        message_id = message_id_of(delivery.raw)
        workflow_id = delivery.workflow_id
        first: asyncpg.Record | None = None
        row: asyncpg.Record | None = None
        # The connection goes back to the pool before the workflow start: a request never
        # holds one connection while it waits for another (that deadlocks a full pool).
        async with self.pool.acquire(timeout=POOL_TIMEOUT_SECONDS) as conn:
            if message_id is None:
                row = await self._insert(conn, delivery, workflow_id, digest, None)
            else:
                # Item or copy, decided under the lock every source takes for this message
                # of this tenant (store/copies.py): one item whichever source comes first.
                async with conn.transaction():
                    await copies.lock_message(conn, tenant=delivery.tenant, key=message_id)
                    first = await self._copy_of(conn, delivery, message_id, digest)
                    if first is None:
                        row = await self._insert(conn, delivery, workflow_id, digest,
                                                 message_id)
                        if row is None:  # refused by the one-item-per-message index
                            first = await self._copy_of(conn, delivery, message_id, digest)
        if first is not None:
            # A copy (docs/architecture.md §10): named as such, with the first item's
            # workflow; nothing new starts (a first item whose start failed is healed, as a
            # redelivery would).
            if not first["started"]:
                await self.start(str(first["event_id"]), delivery.tenant,
                                 first["workflow_id"])
            return IngestResult("copy", first["workflow_id"], first["state"])
        assert row is not None
        if row.get("new"):
            started = await self.start(str(row["event_id"]), delivery.tenant, workflow_id)
            return IngestResult("accepted" if started else "unavailable", workflow_id,
                                "received")
        if row["content_sha256"] != digest:
            async with self.pool.acquire() as conn:
                await audit.append(
                    conn, tenant=delivery.tenant, event_id=str(row["event_id"]),
                    workflow_id=workflow_id, actor=f"relay:{delivery.source}",
                    action="redelivery_content_differs",
                    detail={"delivery_id": delivery.delivery_id, "content_sha256": digest},
                )
        if not row["started"]:
            # The first delivery was stored but its start failed: heal it now.
            await self.start(str(row["event_id"]), delivery.tenant, workflow_id)
        return IngestResult("duplicate", workflow_id, row["state"], raced="new" not in row)

    async def _insert(self, conn: Conn, delivery: Delivery, workflow_id: str,
                      digest: str, message_id: str | None) -> asyncpg.Record | None:
        # One round trip: the new event with its "received" audit entry, or the existing
        # one. Its snapshot cannot see a row a concurrent request committed while this
        # statement waited on the unique key; then one more read finds it (a row without
        # `new`: the race `IngestResult.raced` reports).
        return await events.insert_event(
            conn, tenant=delivery.tenant, source=delivery.source, mailbox=delivery.mailbox,
            delivery_id=delivery.delivery_id, workflow_id=workflow_id, raw=delivery.raw,
            content_sha256=digest, size_bytes=len(delivery.raw),
            actor=f"relay:{delivery.source}", message_id=message_id,
            provider_event=delivery.provider_event.body if delivery.provider_event else None,
            provider_event_type=(delivery.provider_event.content_type
                                 if delivery.provider_event else None),
        ) or await events.find_event(conn, tenant=delivery.tenant, source=delivery.source,
                                     mailbox=delivery.mailbox,
                                     delivery_id=delivery.delivery_id)

    async def _copy_of(self, conn: Conn, delivery: Delivery, message_id: str,
                       digest: str) -> asyncpg.Record | None:
        """The tenant's first item of this message when this delivery is a copy of it, the
        copy recorded (once per delivery key, with its audit entry); else None."""
        first = await copies.copy_target(
            conn, tenant=delivery.tenant, source=delivery.source, mailbox=delivery.mailbox,
            delivery_id=delivery.delivery_id, message_id=message_id, content_sha256=digest)
        if first is not None and not first["recorded"]:
            await copies.record_copy(
                conn, tenant=delivery.tenant, event_id=str(first["event_id"]),
                workflow_id=first["workflow_id"], source=delivery.source,
                mailbox=delivery.mailbox, delivery_id=delivery.delivery_id,
                copy_workflow_id=delivery.workflow_id, message_id=message_id,
                content_sha256=digest,
                actor=f"relay:{delivery.source}")
        return first

    async def start(self, event_id: str, tenant: str, workflow_id: str) -> bool:
        """Start the item's workflow (idempotent). False when Temporal is unavailable."""
        try:
            client = await self.temporal.get(tenant)  # the tenant's namespace
            await client.start_workflow(
                WORKFLOW_TYPE, InboundEmailInput(event_id=event_id, tenant=tenant),
                id=workflow_id, task_queue=self.task_queue,
                # The UI's workflow page: tenant, source and mailbox (the tenant's own
                # address, never personal data); the review card says the rest.
                static_summary=static_summary(workflow_id),
                search_attributes=start_search_attributes(tenant),
                # Its activities inherit it: the tenant's share of the task queues.
                priority=tenant_priority(tenant),
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                rpc_timeout=START_RPC_TIMEOUT,
            )
        except WorkflowAlreadyStartedError:
            pass  # closed earlier under this ID: it ran; never start it twice
        except (TimeoutError, RPCError, OSError, RuntimeError) as exc:
            log.warning("workflow start deferred: %s", type(exc).__name__)
            async with self.pool.acquire(timeout=POOL_TIMEOUT_SECONDS) as conn:
                await events.count_start_failure(conn, event_id=event_id)
            return False
        async with self.pool.acquire(timeout=POOL_TIMEOUT_SECONDS) as conn:
            await events.mark_started(conn, event_id=event_id)
        return True

    async def sweep(self, min_age_seconds: float = 2.0, limit: int = 200) -> int:
        """Start stored-but-unstarted events. Returns how many were started."""
        async with self.pool.acquire() as conn:
            rows = await events.unstarted_events(conn, min_age_seconds=min_age_seconds,
                                                 limit=limit)
        started = 0
        for row in rows:
            if not await self.start(str(row["event_id"]), row["tenant"], row["workflow_id"]):
                break
            started += 1
        return started


def static_summary(workflow_id: str) -> str:
    """What the UI shows at the top of the workflow page, from the workflow ID
    (`inbound/{tenant}/{source}/{mailbox}/{delivery_id}`; the delivery ID is left out)."""
    parts = workflow_id.split("/")
    if len(parts) >= 5 and parts[0] == "inbound":
        return f"inbound email · tenant {parts[1]} · source {parts[2]} · mailbox {parts[3]}"
    return "inbound email"


class Ledger(Protocol):
    """What the ingest path needs of the store: the `Ingestor` (a fake in a fast test)."""

    pool: asyncpg.Pool

    async def ingest(self, delivery: Delivery) -> IngestResult: ...


@dataclass(frozen=True)
class Intake:
    """The one ingest path: every push route and every pull source hands its deliveries to
    `ingest`, which stores and starts them and counts the outcome by source (no other
    labels)."""

    ledger: Ledger
    metrics: RelayMetrics
    # The relay's per-tenant intake rates (one per process; a fresh one admits everything
    # a policy does not limit).
    admission: Admission = field(default_factory=Admission)

    async def ingest(self, delivery: Delivery) -> IngestResult:
        try:
            result = await self.ledger.ingest(delivery)
        except (TimeoutError, asyncpg.PostgresError, OSError):
            log.warning("ledger unavailable")
            result = IngestResult("ledger_unavailable", delivery.workflow_id, "")
        self.metrics.deliveries.labels(delivery.source, result.status).inc()
        if result.raced:
            self.metrics.unique_conflicts.labels(ConflictKind.INTAKE_DELIVERY.value).inc()
        return result

    def count_auth_failure(self, source: str) -> None:
        """Every source feeds the same signature-failure metric (and its spike alert)."""
        self.metrics.signature_failures.labels(source).inc()

    def count_rate_limited(self, source: str) -> None:
        """Over the tenant's intake rate (a 429; the provider redelivers)."""
        self.metrics.deliveries.labels(source, "rate_limited").inc()

    def count_forbidden(self, source: str) -> None:
        """Authenticated, but not for the delivery's tenant (a 403)."""
        self.metrics.deliveries.labels(source, "forbidden").inc()


class Unauthenticated(Exception):
    """Answered 401; the message is logged, never returned."""


class TooLarge(Exception):
    """The rebuilt message exceeds the size limit: answered 413."""


def answer(result: IngestResult) -> JSONResponse:
    if result.status == "ledger_unavailable":
        return error_response(503, "ledger unavailable; retry later")
    if result.status == "unavailable":
        return JSONResponse(
            {"status": "error", "message": "stored; Temporal is unavailable, the workflow will "
             "be started when it is back", "workflow_id": result.workflow_id},
            status_code=503,
        )
    return JSONResponse({"status": result.status, "workflow_id": result.workflow_id,
                         "state": result.state})


def error_response(status_code: int, message: str) -> JSONResponse:
    return JSONResponse({"status": "error", "message": message}, status_code=status_code)


async def sweep_forever(ingestor: Ingestor, settings: Settings) -> None:
    while True:
        await asyncio.sleep(settings.sweeper_interval_seconds)
        try:
            started = await ingestor.sweep()
            if started:
                log.info("sweeper started %d stored event(s)", started)
        except Exception:  # noqa: BLE001 - the sweeper must outlive any single failure
            log.exception("sweeper pass failed")
