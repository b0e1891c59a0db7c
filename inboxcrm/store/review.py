"""Read-only queries behind the review card (`inboxcrm.domain.review_card`): the item with
its open wait, its operations and follow-up intent, and the contacts and suppression it
shows. What a follow-up would do is asked with the planner's own statement
(`intents.followup_blockers`). Nothing here writes; nothing reads workflow history."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

REVIEW_ITEM = """
SELECT e.event_id, e.workflow_id, e.tenant, e.source, e.mailbox, e.state, e.reason, e.route,
       e.route_reasons, e.extraction, e.canonical_email, e.raw, e.contact_id, e.languages,
       t.reason AS wait_reason, t.owner, t.status AS task_status, t.first_seen, t.wait_id,
       t.allowed, t.needs_sender, t.escalate_at, t.escalated_at, t.destination_ref
FROM inbound_events e
LEFT JOIN LATERAL (
    SELECT * FROM review_tasks r WHERE r.workflow_id = e.workflow_id AND r.status = 'open'
    ORDER BY r.task_id DESC LIMIT 1
) t ON true
WHERE e.workflow_id = $1
"""

ITEM_OPERATIONS = """
SELECT op_key, action, status, attempts, max_attempts, last_error_category, last_error,
       destination_id, external_ref, first_attempt_at, key_window_from
FROM operations WHERE workflow_id = $1 ORDER BY first_seen
"""

# Where a person checks an ambiguous operation at its destination, as its adapter said
# when the operation was held (`operation_lookup`, inboxcrm/activities/send.py).
OPERATION_LOOKUP = """
SELECT detail ->> 'lookup' AS lookup, (detail ->> 'key_window_seconds')::float AS window
FROM audit_log
WHERE workflow_id = $1 AND action = 'operation_lookup' AND detail ->> 'op_key' = $2
ORDER BY audit_id DESC LIMIT 1
"""

# The CRM records the item's last CRM upsert met (several with the contact's email).
CRM_CANDIDATES = """
SELECT detail -> 'candidates' AS candidates, detail ->> 'crm' AS crm,
       detail ->> 'reason' AS reason, detail ->> 'old' AS old FROM audit_log
WHERE workflow_id = $1 AND action = 'crm_match_needs_review' ORDER BY audit_id DESC LIMIT 1
"""

EVENT_INTENT = """
SELECT i.intent_id, i.rule_id, i.rule_version, i.template_id, i.status, i.needs_approval,
       i.approved_by, c.email, c.name, c.company, c.contact_id, i.draft_text,
       i.draft_sha256, i.approved_draft_sha256
FROM followup_intents i JOIN contacts c ON c.contact_id = i.contact_id
WHERE i.event_id = $1 ORDER BY i.created_at DESC LIMIT 1
"""

CONTACT_BY_IDENTITY = """
SELECT contact_id, email, name, company, status, crm_record_id
FROM contacts WHERE tenant = $1 AND canonical_email = $2
"""

CONTACTS_BY_NAME = """
SELECT contact_id, email, name, company, status, crm_record_id
FROM contacts WHERE tenant = $1 AND lower(name) = lower($2) AND canonical_email <> $3
ORDER BY created_at LIMIT 10
"""

SUPPRESSION = """
SELECT reason, scope, created_at FROM suppressions WHERE tenant = $1 AND canonical_email = $2
"""


# What the card needs to know of a ramp (docs/architecture.md §6): how long the tenant has
# been live (as events.START_MATCHING says it) and the follow-ups this hour granted so far.
RAMP_NOW = """
SELECT (SELECT extract(epoch FROM now() - (s.value ->> 'since')::timestamptz)
        FROM settings s WHERE s.tenant = $1 AND s.key = 'mode'
          AND s.value ->> 'mode' = 'live') AS live_for_seconds,
       COALESCE((SELECT granted FROM ramp_hours
                 WHERE tenant = $1 AND hour_start = date_trunc('hour', now())), 0) AS granted
"""


async def review_item(conn: Conn, workflow_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(REVIEW_ITEM, workflow_id)


async def item_operations(conn: Conn, workflow_id: str) -> list[asyncpg.Record]:
    return list(await conn.fetch(ITEM_OPERATIONS, workflow_id))


async def operation_lookup(conn: Conn, *, workflow_id: str, op_key: str
                           ) -> asyncpg.Record | None:
    """The lookup path and the provider's key window (seconds; None: no key, SMTP)."""
    row: asyncpg.Record | None = await conn.fetchrow(OPERATION_LOOKUP, workflow_id, op_key)
    return row


async def crm_candidates(conn: Conn, *, workflow_id: str) -> tuple[str | None, list[str]]:
    """(provider, record IDs) of the existing CRM records the item's upsert met; (None, [])
    when it met none."""
    row = await conn.fetchrow(CRM_CANDIDATES, workflow_id)
    if row is None or not isinstance(row["candidates"], list):
        return None, []
    return row["crm"], [str(c) for c in row["candidates"]]


async def crm_candidates_cause(conn: Conn, *, workflow_id: str) -> tuple[str | None, str | None]:
    """(reason, old record ID) of the item's last CRM review: `crm_candidates` (several
    records with the email) or `crm_merged_into_other_contact` (the stored record `old`
    merged into one carrying another contact's ID of ours); (None, None) when none."""
    row = await conn.fetchrow(CRM_CANDIDATES, workflow_id)
    if row is None:
        return None, None
    return row["reason"], row["old"]


async def event_intent(conn: Conn, event_id: Any) -> asyncpg.Record | None:
    return await conn.fetchrow(EVENT_INTENT, event_id)


async def contact_by_identity(conn: Conn, tenant: str, canonical: str
                              ) -> asyncpg.Record | None:
    return await conn.fetchrow(CONTACT_BY_IDENTITY, tenant, canonical)


async def contacts_by_name(conn: Conn, tenant: str, name: str, canonical: str | None
                           ) -> list[asyncpg.Record]:
    return list(await conn.fetch(CONTACTS_BY_NAME, tenant, name, canonical or ""))


async def suppression(conn: Conn, tenant: str, canonical: str) -> asyncpg.Record | None:
    return await conn.fetchrow(SUPPRESSION, tenant, canonical)


async def ramp_now(conn: Conn, *, tenant: str) -> tuple[float | None, int]:
    """(seconds since the tenant went live, None if not live; slots granted this hour)."""
    row = await conn.fetchrow(RAMP_NOW, tenant)
    assert row is not None  # two scalar sub-selects: one row always
    live = row["live_for_seconds"]
    return (float(live) if live is not None else None), int(row["granted"])
