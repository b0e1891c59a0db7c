"""The `match_decisions` table: who an event's sender is (a new or existing contact, name
candidates, or no identity) and by which rule; with an exact match, the CRM operations it
queues."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

from inboxcrm.store.intents import blockers_sql

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# $1 event_id, $2 tenant, $3 decision, $4 rule, $5 contact_id, $6 candidates.
RECORD_MATCH_DECISION = """
INSERT INTO match_decisions (event_id, tenant, decision, rule, contact_id, candidates)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (event_id) DO UPDATE
SET decision = EXCLUDED.decision, rule = EXCLUDED.rule, contact_id = EXCLUDED.contact_id,
    candidates = EXCLUDED.candidates
"""

# An exact match, in one statement: the decision, the event's contact, the audit entry and
# the two CRM operations (upsert $9, note $12). Parameters as RECORD_MATCH_DECISION, then
# $7 workflow_id, $8 audit detail, $9/$10 upsert key/action, $11 max attempts,
# $12/$13 note key/action.
RECORD_CONTACT_MATCH = f"""
WITH decision AS ({RECORD_MATCH_DECISION.strip()}),
linked AS (UPDATE inbound_events SET contact_id = $5 WHERE event_id = $1),
audited AS (
    INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
    VALUES ($2, $1, $7, $5, 'planner', 'contact_matched', $8)
)
INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, external_ref)
VALUES ($9, $7, $1, $10, $11, $5::text), ($12, $7, $1, $13, $11, $1::text)
ON CONFLICT (op_key) DO NOTHING
"""

# Everything the planner reads for an identity whose contact row this transaction holds
# (contacts.UPSERT_CONTACT took its lock; events.START_MATCHING holds the event's), in one
# statement: what an earlier run of this plan wrote (a local activity's result dies with a
# killed worker, so a plan can run again after its follow-up went on the wire: its match to
# this contact by address, and the follow-up it created), what stops a follow-up
# (intents.FOLLOWUP_BLOCKERS, the same text), and — a ramp running — the hour row of the
# ramp, locked here (a no-op upsert: the latest committed row, or a new one at 0) so the
# planner's count of granted slots stands until it commits. Its snapshot is taken after the
# contact lock was granted, so it sees every intent or suppression committed for this
# identity before; none can commit while the lock is held. $1 event_id, $2 contact_id,
# $3 tenant, $4 canonical email, $5 the rule's quiet period in seconds (NULL: no rule),
# $6 the ramp's hourly cap (NULL: no ramp). One row always.
PLAN_FACTS = f"""
WITH ramp AS (
    INSERT INTO ramp_hours (tenant, hour_start)
    SELECT $3, date_trunc('hour', now()) WHERE $6::int IS NOT NULL
    ON CONFLICT (tenant, hour_start) DO UPDATE SET granted = ramp_hours.granted
    RETURNING granted
)
SELECT m.decision, i.intent_id, i.status AS intent_status, i.approval_reason,
       {blockers_sql(tenant="$3", canonical_email="$4", contact_id="$2", event_id="$1",
                     quiet_seconds="$5::float8")},
       (SELECT granted FROM ramp) AS ramp_granted
FROM (SELECT 1) AS one
LEFT JOIN match_decisions m
       ON m.event_id = $1 AND m.contact_id = $2 AND m.rule = 'exact_canonical_email'
LEFT JOIN LATERAL (SELECT intent_id, status, approval_reason FROM followup_intents
                   WHERE event_id = $1 ORDER BY created_at LIMIT 1) i ON true
"""


async def plan_facts(conn: Conn, *, event_id: Any, contact_id: Any, tenant: str,
                     canonical_email: str, quiet_period_hours: float | None,
                     ramp_cap: int | None) -> asyncpg.Record:
    row: asyncpg.Record | None = await conn.fetchrow(
        PLAN_FACTS, event_id, contact_id, tenant, canonical_email,
        None if quiet_period_hours is None else float(quiet_period_hours * 3600), ramp_cap)
    assert row is not None  # a LEFT JOIN of a constant: one row always
    return row


async def record_match_decision(conn: Conn, *, event_id: Any, tenant: str, decision: str,
                                rule: str, contact_id: Any, candidates: list[str]) -> None:
    await conn.execute(RECORD_MATCH_DECISION, event_id, tenant, decision, rule, contact_id,
                       candidates)


async def record_contact_match(
    conn: Conn, *, event_id: Any, tenant: str, decision: str, rule: str, contact_id: Any,
    workflow_id: str, audit_detail: dict[str, Any], crm_op_key: str, crm_action: str,
    max_attempts: int, note_op_key: str, note_action: str,
) -> None:
    await conn.execute(RECORD_CONTACT_MATCH, event_id, tenant, decision, rule, contact_id, [],
                       workflow_id, audit_detail, crm_op_key, crm_action, max_attempts,
                       note_op_key, note_action)
