"""Shadow mode's statements (docs/architecture.md §6, "Going live"): a shadowed item reads
what the planner would read and stores its plan on the event; it writes no contact, match
decision, follow-up intent or operation. Only the report reads the stored plans."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# Shows `matching` and loads what the plan needs; a stored plan answers a re-run.
START_SHADOW_PLAN = """
UPDATE inbound_events SET state = $2, reason = NULL, updated_at = now()
WHERE event_id = $1
RETURNING event_id, tenant, source, raw, extraction, route, route_reasons, canonical_email,
          shadow_plan
"""

# Two shadowed items of one person planned at the same instant see each other's plan (the
# second would match the contact the first would create, and the quiet period holds).
LOCK_IDENTITY = "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))"

# Everything the planner's rules look at for one identity, read-only, in one statement:
# the contact, a suppression, a live follow-up within the quiet period (any rule, as the
# planner), and the shadowed items before this one (a follow-up they would have sent within
# the quiet period; a contact they would have created).
# $1 tenant, $2 canonical email, $3 event_id, $4 the rule's quiet period in seconds.
SHADOW_FACTS = """
SELECT c.contact_id, c.name, c.company, c.status,
       EXISTS (SELECT 1 FROM suppressions s WHERE s.tenant = $1 AND s.canonical_email = $2)
           AS suppressed,
       EXISTS (SELECT 1 FROM followup_intents i
               WHERE i.contact_id = c.contact_id AND i.status <> 'cancelled'
                 AND i.created_at > now() - make_interval(secs => $4)) AS recent_intent,
       EXISTS (SELECT 1 FROM inbound_events e
               WHERE e.tenant = $1 AND e.canonical_email = $2 AND e.event_id <> $3
                 AND e.shadow_plan -> 'followup' ->> 'action' IN ('send', 'await_approval')
                 AND e.received_at > now() - make_interval(secs => $4))
           AS recent_shadow_followup,
       EXISTS (SELECT 1 FROM inbound_events e
               WHERE e.tenant = $1 AND e.canonical_email = $2 AND e.event_id <> $3
                 AND e.shadow_plan -> 'contact' ->> 'action' = 'create') AS shadow_created
FROM (SELECT 1) AS one
LEFT JOIN contacts c ON c.tenant = $1 AND c.canonical_email = $2
"""

# The plan and its audit entry (the plan holds references, reasons and field names only).
# A plan stored by an earlier run stands. $1 event_id, $2 plan, $3 tenant, $4 workflow_id.
STORE_SHADOW_PLAN = """
WITH stored AS (
    UPDATE inbound_events SET shadow_plan = $2, updated_at = now()
    WHERE event_id = $1 AND shadow_plan IS NULL
    RETURNING event_id
)
INSERT INTO audit_log (tenant, event_id, workflow_id, actor, action, detail)
SELECT $3, $1, $4, 'planner', 'shadow_planned', $2 FROM stored
"""

# The report: every item the tenant received in shadow mode (planned or still in flight).
SHADOW_ITEMS = """
SELECT delivery_id, workflow_id, source, received_at, state, reason, route, route_reasons,
       shadow_plan
FROM inbound_events
WHERE tenant = $1 AND shadow IS TRUE AND ($2::timestamptz IS NULL OR received_at >= $2)
ORDER BY received_at, delivery_id
"""

# Follow-ups a ramp held for a reviewer, and those still waiting.
RAMP_HELD = """
SELECT count(*) AS held,
       count(*) FILTER (WHERE status = 'awaiting_approval') AS waiting
FROM followup_intents
WHERE tenant = $1 AND approval_reason = 'ramp_limit' AND created_at >= $2
"""


async def start(conn: Conn, event_id: str, state: str) -> asyncpg.Record | None:
    return await conn.fetchrow(START_SHADOW_PLAN, event_id, state)


async def lock_identity(conn: Conn, tenant: str, canonical: str) -> None:
    await conn.execute(LOCK_IDENTITY, tenant, canonical)


async def facts(conn: Conn, tenant: str, canonical: str, event_id: str,
                quiet_seconds: float) -> asyncpg.Record:
    row: asyncpg.Record | None = await conn.fetchrow(SHADOW_FACTS, tenant, canonical,
                                                     event_id, quiet_seconds)
    assert row is not None  # a LEFT JOIN of a constant: one row always
    return row


async def store_plan(conn: Conn, event_id: str, plan: dict[str, Any], tenant: str,
                     workflow_id: str) -> None:
    await conn.execute(STORE_SHADOW_PLAN, event_id, plan, tenant, workflow_id)


async def items(conn: Conn, tenant: str, since: datetime | None) -> list[asyncpg.Record]:
    return list(await conn.fetch(SHADOW_ITEMS, tenant, since))


async def ramp_held(conn: Conn, tenant: str, since: datetime) -> asyncpg.Record:
    row: asyncpg.Record | None = await conn.fetchrow(RAMP_HELD, tenant, since)
    assert row is not None  # an aggregate: one row always
    return row
