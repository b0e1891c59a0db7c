"""Ledger rows for outbox tests (an event, a contact, its operations and intent, written the
way the planner writes them) and gated destinations: the real sandbox client, with a gate a
test opens when it wants the slow attempt to come back."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import asyncpg
from temporalio.testing import ActivityEnvironment

from inboxcrm.adapters.base import (
    AdapterError,
    ContactFields,
    CrmClient,
    CrmRecord,
    CrmRecordView,
    Filled,
    MailClient,
    OutgoingEmail,
    SentEmail,
    SentRecord,
    Unverifiable,
)
from inboxcrm.adapters.errors import Category, Classified
from inboxcrm.schemas.models import ItemRef, OperationInput


def step_env(timeout: float = 45.0) -> ActivityEnvironment:
    """An activity context as a step gets it: started now, with the step's timeout (the send
    lease is what is left of it)."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, started_time=datetime.now(UTC),
                                   start_to_close_timeout=timedelta(seconds=timeout))
    return env


@dataclass(frozen=True)
class PlannedItem:
    item: ItemRef
    email: str
    contact_id: str
    intent_id: str

    def op(self, action: str) -> OperationInput:
        return OperationInput(self.item, f"{self.item.workflow_id}:{action}")


async def planned_item(pool: asyncpg.Pool, *, tenant: str = "acme",
                       max_attempts: int = 6) -> PlannedItem:
    """An item as match_and_plan leaves it: contact, queued intent, CRM and send operations
    (no workflow runs it: the test drives the attempts itself)."""
    delivery = uuid.uuid4().hex
    email = f"fence.{delivery[:10]}@example.com"
    workflow_id = f"inbound/{tenant}/test/sales@acme.test/{delivery}"
    event_id = await pool.fetchval(
        "INSERT INTO inbound_events (tenant, source, mailbox, delivery_id, workflow_id, "
        "content_sha256, size_bytes, state) VALUES ($1, 'test', 'sales@acme.test', $2, $3, "
        "'x', 1, 'crm_pending') RETURNING event_id", tenant, delivery, workflow_id)
    contact_id = await pool.fetchval(
        "INSERT INTO contacts (tenant, canonical_email, email, name) VALUES ($1, $2, $2, "
        "'Fen Ce') RETURNING contact_id", tenant, email)
    intent_id = await pool.fetchval(
        "INSERT INTO followup_intents (event_id, tenant, contact_id, rule_id, rule_version, "
        "template_id) VALUES ($1, $2, $3, 'ack', 1, 'ack-v1') RETURNING intent_id",
        event_id, tenant, contact_id)
    await pool.execute(
        "INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, "
        "external_ref) VALUES ($1, $2, $3, 'crm-upsert', $4, $5), "
        "($6, $2, $3, 'send', $4, $7)",
        f"{workflow_id}:crm-upsert", workflow_id, event_id, max_attempts, str(contact_id),
        f"{workflow_id}:send", str(intent_id))
    item = ItemRef(event_id=str(event_id), workflow_id=workflow_id, tenant=tenant)
    return PlannedItem(item, email, str(contact_id), str(intent_id))


@dataclass
class Gate:
    """Where a slow attempt waits: `entered` once its call reached the destination."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    opened: asyncio.Event = field(default_factory=asyncio.Event)

    async def hold(self) -> None:
        self.entered.set()
        await self.opened.wait()


LOST_ANSWER = AdapterError(Classified(Category.UNKNOWN, "read_timeout"))


class GatedCrm:
    """The real CRM client whose upsert takes effect at the destination, then stalls at the
    gate and loses its answer (`lose_answer`) or returns it late."""

    def __init__(self, real: CrmClient, gate: Gate, *, lose_answer: bool) -> None:
        self.name = real.name
        self._real = real
        self._gate = gate
        self._lose = lose_answer

    async def upsert_contact(self, external_id: str, fields: ContactFields) -> CrmRecord:
        record = await self._real.upsert_contact(external_id, fields)
        await self._gate.hold()
        if self._lose:
            raise LOST_ANSWER
        return record

    async def find_contact(self, external_id: str) -> CrmRecord | None:
        return await self._real.find_contact(external_id)

    async def fill_contact(self, record_id: str, fields: ContactFields,
                           allowed: Collection[str]) -> Filled | None:
        return await self._real.fill_contact(record_id, fields, allowed)

    async def log_note(self, note_key: str, record_id: str, text: str,
                       occurred_at: datetime) -> str:
        return await self._real.log_note(note_key, record_id, text, occurred_at)

    async def associate_note(self, note_id: str, record_id: str) -> None:
        await self._real.associate_note(note_id, record_id)

    async def read_contact(self, record_id: str) -> CrmRecordView | None:
        return await self._real.read_contact(record_id)

    async def find_note(self, note_key: str) -> str | None:
        return await self._real.find_note(note_key)

    async def aclose(self) -> None:
        return None


class GatedMail:
    """The real mail client, gated the same way after the provider accepted the email."""

    def __init__(self, real: MailClient, gate: Gate, *, lose_answer: bool) -> None:
        self.name = real.name
        self.reconcilable = real.reconcilable
        self.key_window_seconds = real.key_window_seconds
        self._real = real
        self._gate = gate
        self._lose = lose_answer

    async def send(self, idempotency_key: str, message: OutgoingEmail) -> SentEmail:
        sent = await self._real.send(idempotency_key, message)
        await self._gate.hold()
        if self._lose:
            raise LOST_ANSWER
        return sent

    async def read_sent(self, message_id: str) -> SentRecord | None:
        return await self._real.read_sent(message_id)

    def where_to_look(self, idempotency_key: str) -> str:
        return self._real.where_to_look(idempotency_key)

    async def aclose(self) -> None:
        return None


class UnsearchableMail:
    """The real mail client as an SMTP relay looks to the outbox: it cannot be searched, and
    its first `drops` submissions end without an answer (and, as a person later checks,
    without an email)."""

    reconcilable = False
    key_window_seconds = None

    def __init__(self, real: MailClient, *, drops: int) -> None:
        self.name = "smtp"
        self._real = real
        self._drops = drops

    async def send(self, idempotency_key: str, message: OutgoingEmail) -> SentEmail:
        if self._drops > 0:
            self._drops -= 1
            raise LOST_ANSWER
        return await self._real.send(idempotency_key, message)

    async def read_sent(self, message_id: str) -> SentRecord | None:
        raise Unverifiable("smtp_not_searchable")

    def where_to_look(self, idempotency_key: str) -> str:
        return f"the relay's log: the message with key {idempotency_key}"

    async def aclose(self) -> None:
        return None


async def later_item(pool: asyncpg.Pool, contact_id: str, *actions: str,
                     tenant: str = "acme") -> ItemRef:
    """The event and one queued operation per action (`crm-upsert` refers to the contact,
    every other action to the event), each with the ledger's usual budget of 6 attempts."""
    delivery = uuid.uuid4().hex
    workflow_id = f"inbound/{tenant}/test/sales@acme.test/{delivery}"
    event_id = await pool.fetchval(
        "INSERT INTO inbound_events (tenant, source, mailbox, delivery_id, workflow_id, "
        "content_sha256, size_bytes, state, contact_id) VALUES ($1, 'test', "
        "'sales@acme.test', $2, $3, 'x', 1, 'crm_pending', $4::uuid) RETURNING event_id",
        tenant, delivery, workflow_id, contact_id)
    for action in actions:
        await pool.execute(
            "INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, "
            "external_ref) VALUES ($1, $2, $3, $4, 6, $5)", f"{workflow_id}:{action}",
            workflow_id, event_id, action,
            contact_id if action == "crm-upsert" else str(event_id))
    return ItemRef(event_id=str(event_id), workflow_id=workflow_id, tenant=tenant)
