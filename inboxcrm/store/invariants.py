"""What the invariant checker (inboxcrm/verify/check.py) reads: every statement
parameterised, $1 the scope (a workflow ID prefix) or NULL for everything."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncpg

    from inboxcrm.store.db import Conn

IN_SCOPE = "($1::text IS NULL OR starts_with({col}, $1::text))"

EVENTS = f"""
SELECT e.workflow_id, e.state, e.reason, r.owner AS open_task_owner
FROM inbound_events e
LEFT JOIN review_tasks r ON r.workflow_id = e.workflow_id AND r.status = 'open'
WHERE {IN_SCOPE.format(col="e.workflow_id")}
"""

DUPLICATE_DELIVERIES = f"""
SELECT e.workflow_id FROM inbound_events e
JOIN (SELECT tenant, source, mailbox, delivery_id FROM inbound_events
      GROUP BY 1, 2, 3, 4 HAVING count(*) > 1) d USING (tenant, source, mailbox, delivery_id)
WHERE {IN_SCOPE.format(col="e.workflow_id")}
UNION
SELECT e.workflow_id FROM inbound_events e
JOIN (SELECT workflow_id FROM inbound_events GROUP BY 1 HAVING count(*) > 1) d
     USING (workflow_id)
WHERE {IN_SCOPE.format(col="e.workflow_id")}
"""

SCOPED_CONTACTS = f"""
SELECT c.contact_id::text AS contact_id, c.tenant, lower(c.canonical_email) AS identity,
       lower(c.email) AS email, c.crm_record_id, c.status
FROM contacts c
WHERE $1::text IS NULL OR EXISTS (
    SELECT 1 FROM inbound_events e
    WHERE {IN_SCOPE.format(col="e.workflow_id")}
      AND (e.contact_id = c.contact_id
           OR (e.tenant = c.tenant AND lower(e.canonical_email) = lower(c.canonical_email))))
"""

SCOPED_INTENTS = f"""
SELECT i.intent_id::text AS intent_id, i.event_id, i.rule_id, i.rule_version, i.status,
       i.sent_at, i.provider_message_id, c.tenant, lower(c.canonical_email) AS identity,
       i.repeats_intent_id::text AS repeats_intent_id
FROM followup_intents i
JOIN inbound_events e ON e.event_id = i.event_id
JOIN contacts c ON c.contact_id = i.contact_id
WHERE {IN_SCOPE.format(col="e.workflow_id")}
"""

KNOWN_INTENTS = """
SELECT intent_id::text FROM followup_intents WHERE intent_id::text = ANY($1::text[])
"""

SUPPRESSIONS = """
SELECT tenant, lower(canonical_email) AS identity, created_at FROM suppressions
"""

OPERATIONS = f"""
SELECT o.op_key, o.workflow_id, o.action, o.status, o.attempts, o.max_attempts,
       o.external_ref, o.destination_id, e.contact_id::text AS contact_id
FROM operations o LEFT JOIN inbound_events e ON e.event_id = o.event_id
WHERE {IN_SCOPE.format(col="o.workflow_id")}
"""


async def read_store(conn: Conn, scope: str | None) -> tuple[list[Any], ...]:
    """Events, contacts, intents, operations, suppressions and duplicate deliveries, from
    one consistent snapshot."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return (await conn.fetch(EVENTS, scope), await conn.fetch(SCOPED_CONTACTS, scope),
                await conn.fetch(SCOPED_INTENTS, scope), await conn.fetch(OPERATIONS, scope),
                await conn.fetch(SUPPRESSIONS), await conn.fetch(DUPLICATE_DELIVERIES, scope))


async def known_intents(conn: Conn | asyncpg.Pool, keys: list[str]) -> set[str]:
    """Which of these idempotency keys are intents of ours."""
    return {r["intent_id"] for r in await conn.fetch(KNOWN_INTENTS, keys)}
