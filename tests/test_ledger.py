"""The ledger's two one-statement writes, on a real PostgreSQL database of their own:
`BEGIN_ATTEMPT` (pause switch, claim, state mirror) and `complete_attempt` (ledger row,
the action's mirror, audit entry), branch by branch."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from inboxcrm.stack import postgres
from inboxcrm.store import db as inboxcrm_db
from inboxcrm.store import ledger
from inboxcrm.store.migrate import apply_migrations

TENANT = "acme"


@pytest.fixture(scope="module")
async def pool(postgres_server_url: str) -> AsyncIterator[asyncpg.Pool]:
    url = await postgres.create_database(postgres_server_url, "inboxcrm_ledger")
    await apply_migrations(url)
    created = await inboxcrm_db.create_pool(url, max_size=3)
    yield created
    await created.close()
    await postgres.drop_database(postgres_server_url, url)


async def _operation(pool: asyncpg.Pool, *, attempts: int = 0, max_attempts: int = 3,
                     status: str = "pending", category: str | None = None,
                     tenant: str = TENANT) -> tuple[str, str, str]:
    """An event, a contact and its CRM operation row; returns (op_key, event_id, contact_id)."""
    delivery = uuid.uuid4().hex
    workflow_id = f"inbound/{tenant}/test/{delivery}"
    event_id = await pool.fetchval(
        "INSERT INTO inbound_events (tenant, source, mailbox, delivery_id, workflow_id, "
        "content_sha256, size_bytes) VALUES ($1, 'test', 'sales@acme.test', $2, $3, 'x', 1) "
        "RETURNING event_id", tenant, delivery, workflow_id)
    contact_id = await pool.fetchval(
        "INSERT INTO contacts (tenant, canonical_email, email) VALUES ($1, $2, $2) "
        "RETURNING contact_id", tenant, f"{delivery}@example.com")
    op_key = f"{workflow_id}:crm-upsert"
    await pool.execute(
        "INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, "
        "external_ref, attempts, status, last_error_category) "
        "VALUES ($1, $2, $3, 'crm-upsert', $4, $5, $6, $7, $8)",
        op_key, workflow_id, event_id, max_attempts, str(contact_id), attempts, status,
        category)
    return op_key, str(event_id), str(contact_id)


async def _begin(pool: asyncpg.Pool, op_key: str, event_id: str, *, scope: str = "crm",
                 tenant: str = TENANT) -> ledger.Claim:
    async with pool.acquire() as conn:
        return await ledger.begin_attempt(conn, op_key, tenant=tenant, pause_scope=scope,
                                          event_id=event_id, running_state="crm_pending")


async def _row(pool: asyncpg.Pool, sql: str, *args: Any) -> asyncpg.Record:
    row = await pool.fetchrow(sql, *args)
    assert row is not None
    return row


async def _switch(pool: asyncpg.Pool, tenant: str, key: str, on: bool) -> None:
    await pool.execute(
        "INSERT INTO settings (tenant, key, value) VALUES ($1, $2, $3) ON CONFLICT (tenant, key) "
        "DO UPDATE SET value = EXCLUDED.value", tenant, key, on)


async def test_first_attempt_claims_and_shows_the_running_state(pool: asyncpg.Pool) -> None:
    op_key, event_id, contact_id = await _operation(pool)

    claim = await _begin(pool, op_key, event_id)

    assert (claim.paused, claim.already_completed, claim.exhausted) == (False, False, False)
    assert (claim.attempts, claim.needs_reconcile, claim.external_ref) == (1, False, contact_id)
    op = await _row(pool, "SELECT status, attempts FROM operations WHERE op_key = $1", op_key)
    assert (op["status"], op["attempts"]) == ("in_progress", 1)
    event = await _row(pool, "SELECT state, reason FROM inbound_events WHERE event_id = $1",
                       uuid.UUID(event_id))
    assert (event["state"], event["reason"]) == ("crm_pending", None)


@pytest.mark.parametrize(("status", "category"), [("in_progress", None), ("waiting", "unknown")])
async def test_an_uncertain_previous_attempt_must_be_reconciled(
        pool: asyncpg.Pool, status: str, category: str | None) -> None:
    op_key, event_id, _ = await _operation(pool, attempts=1, status=status, category=category)

    claim = await _begin(pool, op_key, event_id)

    assert claim.needs_reconcile and claim.attempts == 2


async def test_a_failed_but_certain_attempt_is_simply_retried(pool: asyncpg.Pool) -> None:
    op_key, event_id, _ = await _operation(pool, attempts=1, status="waiting",
                                           category="transient")
    claim = await _begin(pool, op_key, event_id)
    assert not claim.needs_reconcile and claim.attempts == 2


async def test_out_of_attempts_claims_nothing_and_leaves_the_state(pool: asyncpg.Pool) -> None:
    op_key, event_id, _ = await _operation(pool, attempts=3, max_attempts=3, status="waiting")

    claim = await _begin(pool, op_key, event_id)

    assert claim.exhausted and claim.attempts == 3
    op = await _row(pool, "SELECT status, attempts FROM operations WHERE op_key = $1", op_key)
    assert (op["status"], op["attempts"]) == ("waiting", 3)
    event = await _row(pool, "SELECT state FROM inbound_events WHERE event_id = $1",
                       uuid.UUID(event_id))
    assert event["state"] == "received"


async def test_unknown_operation_is_an_error(pool: asyncpg.Pool) -> None:
    _, event_id, _ = await _operation(pool)
    with pytest.raises(ledger.OperationNotFound):
        await _begin(pool, "inbound/acme/test/nope:crm-upsert", event_id)


@pytest.mark.parametrize(("tenant", "key", "scope", "paused"), [
    ("acme", "paused.crm", "crm", True),
    ("*", "paused.crm", "crm", True),
    ("acme", "paused.all", "crm", True),
    ("acme", "paused.send", "crm", False),   # another scope
    ("other", "paused.crm", "crm", False),   # another tenant
])
async def test_pause_switches(pool: asyncpg.Pool, tenant: str, key: str, scope: str,
                              paused: bool) -> None:
    op_key, event_id, _ = await _operation(pool)
    await _switch(pool, tenant, key, True)
    try:
        claim = await _begin(pool, op_key, event_id, scope=scope)
    finally:
        await _switch(pool, tenant, key, False)

    assert claim.paused is paused
    op = await _row(pool, "SELECT status, attempts FROM operations WHERE op_key = $1", op_key)
    event = await _row(pool, "SELECT state, reason FROM inbound_events WHERE event_id = $1",
                       uuid.UUID(event_id))
    if paused:
        assert (op["status"], op["attempts"]) == ("pending", 0)  # nothing claimed
        assert (event["state"], event["reason"]) == ("crm_pending", "paused")
    else:
        assert (op["status"], op["attempts"]) == ("in_progress", 1)
        assert (event["state"], event["reason"]) == ("crm_pending", None)


async def _succeed(pool: asyncpg.Pool, op_key: str, event_id: str, contact_id: str,
                   destination_id: str, ref: str) -> None:
    owned = await ledger.complete_attempt(
        pool, op_key, token=1, destination_id=destination_id, external_ref=ref,
        also=ledger.AlsoRecord.CRM_RECORD_ON_CONTACT,
        entry=ledger.SuccessEntry(tenant=TENANT, event_id=event_id, workflow_id="wf",
                                  actor="crm", action="crm_upserted",
                                  detail={"op_key": op_key}, contact_id=contact_id))
    assert owned


async def test_success_writes_ledger_mirror_and_audit_together(pool: asyncpg.Pool) -> None:
    op_key, event_id, contact_id = await _operation(pool)
    await _begin(pool, op_key, event_id)

    await _succeed(pool, op_key, event_id, contact_id, "crm-42", contact_id)

    op = await _row(pool, "SELECT status, destination_id FROM operations WHERE op_key = $1",
                    op_key)
    assert (op["status"], op["destination_id"]) == ("completed", "crm-42")
    contact = await _row(pool, "SELECT crm_record_id FROM contacts WHERE contact_id = $1",
                         uuid.UUID(contact_id))
    assert contact["crm_record_id"] == "crm-42"
    audits = await pool.fetchval(
        "SELECT count(*) FROM audit_log WHERE event_id = $1 AND action = 'crm_upserted'",
        uuid.UUID(event_id))
    assert audits == 1
    # ...and the next attempt returns the stored result instead of calling out again.
    again = await _begin(pool, op_key, event_id)
    assert again.already_completed and again.destination_id == "crm-42"


async def test_success_is_all_or_nothing(pool: asyncpg.Pool) -> None:
    op_key, event_id, contact_id = await _operation(pool)
    await _begin(pool, op_key, event_id)

    with pytest.raises(asyncpg.PostgresError):  # the mirror fails: not a contact ID
        await _succeed(pool, op_key, event_id, contact_id, "crm-43", "not-a-uuid")

    op = await _row(pool, "SELECT status FROM operations WHERE op_key = $1", op_key)
    assert op["status"] == "in_progress"
    audits = await pool.fetchval(
        "SELECT count(*) FROM audit_log WHERE event_id = $1 AND action = 'crm_upserted'",
        uuid.UUID(event_id))
    assert audits == 0


async def test_the_quiet_period_is_per_contact_across_rules(pool: asyncpg.Pool) -> None:
    """A follow-up under one rule keeps every rule quiet for that contact (README: one
    follow-up per contact per quiet period)."""
    from inboxcrm.store.intents import FOLLOWUP_BLOCKERS

    _, first_event, contact_id = await _operation(pool)
    _, second_event, _ = await _operation(pool)
    await pool.execute(
        "INSERT INTO followup_intents (event_id, tenant, contact_id, rule_id, rule_version, "
        "template_id) VALUES ($1::uuid, $2, $3::uuid, 'ack', 1, 'ack-v1')",
        first_event, TENANT, contact_id)

    # The second event would follow up under another rule ("renewal"), for the same contact.
    blockers = await _row(pool, FOLLOWUP_BLOCKERS, TENANT, "nobody@example.com",
                          uuid.UUID(contact_id), uuid.UUID(second_event), 24 * 3600.0)

    assert (blockers["suppressed"], blockers["recent"]) == (False, True)
