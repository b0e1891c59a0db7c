"""The same-work floor (issue 38): the least pipeline that does the product's required work.

On the same Temporal server, PostgreSQL and sandbox as the product, and nothing more:

- relay (`python -m bench.samework relay --port P`, FastAPI + uvicorn, one process like the
  product's relay): verify the Standard Webhooks signature, insert the delivery with
  `ON CONFLICT DO NOTHING`, start one workflow per delivery ID (id-reuse policy
  REJECT_DUPLICATE: a redelivery starts nothing, whether the first run is open or closed);
- worker (`python -m bench.samework worker --task-queue Q`, as many processes as the
  product's): `SameWorkWorkflow`, local activities only, the product's worker options
  (`inboxcrm.worker.worker_options`: no workflow sandbox, as the product runs):
  1. parse the sender (headers only);
  2. one transaction: contact upsert + follow-up intent (one per contact: the quiet period)
     + outbox row;
  3. the CRM upsert by external ID, the note upsert by its key and the note → contact
     association (the sandbox's HubSpot API), the result recorded;
  4. the send with the intent as the idempotency key (the sandbox's Resend API), the result
     and the delivery's end recorded in one transaction.

Tables live in the schema `samework` of the product's database (`SCHEMA`, created by the
benchmark). The same HTTP stack as the product's adapters (`inboxcrm.adapters.transport`).
"""

from __future__ import annotations

import argparse
import asyncio
import binascii
import contextlib
import email.parser
import email.policy
import email.utils
import hashlib
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from temporalio import activity, workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

WORKFLOW_NAME = "SameWorkWorkflow"
READY = "same-work worker running on task queue"
RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=5)
LOCAL = timedelta(seconds=20)
NOTE_ID_PROPERTY = "inboxcrm_note_id"
ID_PROPERTY = "inboxcrm_contact_id"

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS samework;
CREATE TABLE IF NOT EXISTS samework.deliveries (
    delivery_id text PRIMARY KEY,
    tenant text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    state text NOT NULL DEFAULT 'accepted',
    done_at timestamptz
);
CREATE TABLE IF NOT EXISTS samework.contacts (
    tenant text NOT NULL,
    email text NOT NULL,
    name text,
    crm_id text,
    PRIMARY KEY (tenant, email)
);
CREATE TABLE IF NOT EXISTS samework.intents (
    id uuid PRIMARY KEY,
    tenant text NOT NULL,
    email text NOT NULL,
    delivery_id text NOT NULL,
    message_id text,
    UNIQUE (tenant, email)
);
CREATE TABLE IF NOT EXISTS samework.outbox (
    id bigserial PRIMARY KEY,
    intent_id uuid NOT NULL,
    kind text NOT NULL,
    done boolean NOT NULL DEFAULT false
);
"""

INSERT_DELIVERY = """
INSERT INTO samework.deliveries (delivery_id, tenant) VALUES ($1, $2)
ON CONFLICT DO NOTHING RETURNING delivery_id
"""
UPSERT_CONTACT = """
INSERT INTO samework.contacts (tenant, email, name) VALUES ($1, $2, $3)
ON CONFLICT (tenant, email) DO UPDATE SET name = EXCLUDED.name
"""
INSERT_INTENT = """
INSERT INTO samework.intents (id, tenant, email, delivery_id) VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING RETURNING id
"""
INSERT_OUTBOX = "INSERT INTO samework.outbox (intent_id, kind) VALUES ($1, 'send')"
RECORD_CRM = "UPDATE samework.contacts SET crm_id = $3 WHERE tenant = $1 AND email = $2"
RECORD_SENT = "UPDATE samework.intents SET message_id = $2 WHERE id = $1"
RECORD_OUTBOX = "UPDATE samework.outbox SET done = true WHERE intent_id = $1"
RECORD_DONE = """
UPDATE samework.deliveries SET state = $2, done_at = now() WHERE delivery_id = $1
"""

PROGRESS = """
SELECT state, count(*) AS n FROM samework.deliveries WHERE delivery_id LIKE $1 GROUP BY state
"""
TIMES = """
SELECT state, extract(epoch FROM received_at)::float8 AS received,
       extract(epoch FROM done_at)::float8 AS settled
FROM samework.deliveries WHERE delivery_id LIKE $1
"""


@dataclass
class SameWorkInput:
    delivery_id: str
    tenant: str
    raw: str


@dataclass
class Stored:
    email: str
    name: str
    intent_id: str | None  # None: the contact already has a follow-up (quiet period)


# --- activities (all local; module state is this worker process's clients) --------------
class Clients:
    pool: asyncpg.Pool | None = None
    http: Any = None


def parse_sender(raw: str) -> tuple[str, str]:
    """(email, display name) of the From header; headers only, as the relay's budget."""
    headers = email.parser.HeaderParser(policy=email.policy.compat32).parsestr(raw)
    name, address = email.utils.parseaddr(headers.get("From", ""))
    return address.strip().lower(), name.strip()


def external_id(tenant: str, address: str) -> str:
    return hashlib.sha256(f"{tenant}\0{address}".encode()).hexdigest()[:32]


@activity.defn(name="sw_parse_and_store")
async def parse_and_store(params: SameWorkInput) -> Stored:
    address, name = parse_sender(params.raw)
    intent = uuid.uuid5(uuid.NAMESPACE_URL, f"samework/{params.delivery_id}")
    assert Clients.pool is not None
    async with Clients.pool.acquire() as conn, conn.transaction():
        await conn.execute(UPSERT_CONTACT, params.tenant, address, name)
        row = await conn.fetchrow(INSERT_INTENT, intent, params.tenant, address,
                                  params.delivery_id)
        if row is not None:
            await conn.execute(INSERT_OUTBOX, intent)
    if row is None:  # a retry of this step finds its own intent
        mine = await Clients.pool.fetchval(
            "SELECT id FROM samework.intents WHERE tenant = $1 AND email = $2 "
            "AND delivery_id = $3", params.tenant, address, params.delivery_id)
        intent_id = str(mine) if mine is not None else None
    else:
        intent_id = str(intent)
    return Stored(address, name, intent_id)


@activity.defn(name="sw_crm")
async def crm(params: SameWorkInput, stored: Stored) -> str:
    first, _, last = stored.name.partition(" ")
    ext = external_id(params.tenant, stored.email)
    properties = {"email": stored.email, ID_PROPERTY: ext}
    if first:
        properties["firstname"] = first
    if last:
        properties["lastname"] = last
    response = await Clients.http.post("/crm/v3/objects/contacts/batch/upsert", json={
        "inputs": [{"idProperty": ID_PROPERTY, "id": ext, "properties": properties}]})
    response.raise_for_status()
    record = str(response.json()["results"][0]["id"])
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    response = await Clients.http.post("/crm/v3/objects/notes/batch/upsert", json={
        "inputs": [{"idProperty": NOTE_ID_PROPERTY, "id": params.delivery_id, "properties": {
            "hs_note_body": "Inbound email", "hs_timestamp": stamp,
            NOTE_ID_PROPERTY: params.delivery_id}}]})
    response.raise_for_status()
    note = str(response.json()["results"][0]["id"])
    response = await Clients.http.put(
        f"/crm/v4/objects/notes/{note}/associations/default/contacts/{record}")
    response.raise_for_status()
    assert Clients.pool is not None
    await Clients.pool.execute(RECORD_CRM, params.tenant, stored.email, record)
    return record


@activity.defn(name="sw_send")
async def send(params: SameWorkInput, stored: Stored) -> str:
    message_id = ""
    if stored.intent_id is not None:
        response = await Clients.http.post("/emails", headers={
            "Idempotency-Key": stored.intent_id}, json={
            "from": "Acme Sales <sales@acme.test>", "to": [stored.email],
            "subject": "Thanks for your message", "text": "We will be in touch.",
            "headers": {}})
        response.raise_for_status()
        message_id = str(response.json()["id"])
    assert Clients.pool is not None
    async with Clients.pool.acquire() as conn, conn.transaction():
        if stored.intent_id is not None:
            await conn.execute(RECORD_SENT, uuid.UUID(stored.intent_id), message_id)
            await conn.execute(RECORD_OUTBOX, uuid.UUID(stored.intent_id))
        await conn.execute(RECORD_DONE, params.delivery_id, "completed")
    return message_id


ACTIVITIES: list[Callable[..., Any]] = [parse_and_store, crm, send]


@workflow.defn(name=WORKFLOW_NAME)
class SameWorkWorkflow:
    @workflow.run
    async def run(self, params: SameWorkInput) -> str:
        stored = await workflow.execute_local_activity(
            parse_and_store, params, start_to_close_timeout=LOCAL, retry_policy=RETRY)
        await workflow.execute_local_activity(
            crm, args=[params, stored], start_to_close_timeout=LOCAL, retry_policy=RETRY)
        await workflow.execute_local_activity(
            send, args=[params, stored], start_to_close_timeout=LOCAL, retry_policy=RETRY)
        return "completed"


# --- processes ---------------------------------------------------------------------------
async def run_worker(task_queue: str, metrics_address: str | None) -> None:
    from temporalio.client import Client
    from temporalio.worker import Worker

    from inboxcrm.adapters.transport import new_client
    from inboxcrm.platform import temporal
    from inboxcrm.platform.config import Settings
    from inboxcrm.worker import DB_POOL_SIZE, worker_options

    settings = Settings()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    client = await Client.connect(settings.temporal_address,
                                  namespace=settings.temporal_namespace,
                                  runtime=temporal.metrics_runtime(metrics_address))
    Clients.pool = await asyncpg.create_pool(settings.database_url, min_size=1,
                                             max_size=DB_POOL_SIZE)
    Clients.http = new_client(os.environ["INBOXCRM_SANDBOX_URL"], {}, 20.0)
    options = worker_options(settings)
    worker = Worker(client, task_queue=task_queue, workflows=[SameWorkWorkflow],
                    activities=ACTIVITIES, **options)
    try:
        async with worker:
            print(f"{READY} {task_queue}", flush=True)
            await stop.wait()
    finally:
        await Clients.http.aclose()
        await Clients.pool.close()


def create_relay(secret: str, database_url: str, temporal_address: str,
                 task_queue: str) -> FastAPI:
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError
    from temporalio.client import Client

    webhook = Webhook(secret)
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state["pool"] = await asyncpg.create_pool(database_url, min_size=1, max_size=10)
        state["client"] = await Client.connect(temporal_address)
        yield
        await state["pool"].close()

    app = FastAPI(title="bench same-work relay", lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": "pool" in state})

    @app.post("/v1/inbound/standard")
    async def inbound(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            webhook.verify(body, dict(request.headers), json_parse=False)
            payload = json.loads(body)
            delivery_id, tenant, raw = payload["delivery_id"], payload["tenant"], payload["raw"]
        except (WebhookVerificationError, UnicodeDecodeError, ValueError, KeyError,
                binascii.Error):
            return JSONResponse({"status": "error"}, status_code=401)
        await state["pool"].fetchval(INSERT_DELIVERY, delivery_id, tenant)
        try:
            # Also on a conflict: a delivery stored by a request that died before its start
            # is started by the redelivery; the id-reuse policy starts nothing twice.
            await state["client"].start_workflow(
                WORKFLOW_NAME, SameWorkInput(delivery_id, tenant, raw),
                id=f"samework/{delivery_id}", task_queue=task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE)
        except WorkflowAlreadyStartedError:
            return JSONResponse({"status": "duplicate"})
        # Whichever request started the run was accepted (a redelivery racing its first
        # delivery may be the one); every other is a duplicate.
        return JSONResponse({"status": "accepted"})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="role", required=True)
    worker = sub.add_parser("worker")
    worker.add_argument("--task-queue", required=True)
    worker.add_argument("--metrics-address")
    relay = sub.add_parser("relay")
    relay.add_argument("--port", type=int, required=True)
    relay.add_argument("--task-queue", required=True)
    args = parser.parse_args()
    import uvloop

    if args.role == "worker":
        uvloop.run(run_worker(args.task_queue, args.metrics_address))
        return
    import uvicorn

    from inboxcrm.platform.config import Settings

    settings = Settings()
    app = create_relay(settings.webhook_secret, settings.database_url,
                       settings.temporal_address, args.task_queue)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", loop="uvloop")


if __name__ == "__main__":
    main()
