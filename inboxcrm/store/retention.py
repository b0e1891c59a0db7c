"""Retention and data-subject requests.

- purge: raw content past retention is deleted; hashes, routes, reasons and the decision
  trail stay, so "why did this happen?" can still be answered.
- forget: a person's personal data is removed from the integration store and the fact is
  recorded (without the address). The suppression row, if any, is kept: it is what honours
  their opt-out (documented in the README). The CRM's own copy is the CRM's deletion.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# Items still waiting for a person keep their content: the reviewer needs it.
PURGE_RAW = """
UPDATE inbound_events
SET raw = NULL,
    extraction = CASE WHEN extraction IS NULL THEN NULL ELSE jsonb_build_object(
        'intent', extraction -> 'intent',
        'purged', true) END,
    updated_at = now()
WHERE received_at < now() - make_interval(days => $1)
  AND raw IS NOT NULL
  AND state IN ('completed', 'ignored', 'suppressed', 'rejected', 'failed', 'shadowed')
RETURNING event_id, workflow_id
"""

FORGET_CONTACTS = """
UPDATE contacts
SET canonical_email = 'forgotten:' || $3, email = 'forgotten', name = NULL, company = NULL,
    status = 'forgotten', updated_at = now()
WHERE tenant = ANY($1::text[]) AND canonical_email = $2
RETURNING contact_id, tenant
"""

FORGET_EVENTS = """
UPDATE inbound_events
SET raw = NULL, extraction = NULL, canonical_email = NULL, updated_at = now()
WHERE tenant = ANY($1::text[]) AND (canonical_email = $2 OR contact_id = ANY($3::uuid[]))
RETURNING event_id, workflow_id, tenant
"""

REDACT_AUDIT = """
UPDATE audit_log SET detail = detail - 'evidence'
WHERE workflow_id = ANY($1::text[]) AND detail ? 'evidence'
"""

CANCEL_OPEN_INTENTS = """
UPDATE followup_intents SET status = 'cancelled', cancel_reason = 'forgotten'
WHERE contact_id = ANY($1::uuid[]) AND status IN ('queued', 'awaiting_approval')
"""

RECORD = """
INSERT INTO audit_log (tenant, actor, action, detail) VALUES ($1, $2, $3, $4)
"""


@dataclass(frozen=True)
class ForgetReport:
    contacts: int
    events: int


async def purge(conn: Conn, older_than_days: int, actor: str) -> int:
    if older_than_days < 1:
        raise ValueError("--older-than must be at least 1 day")
    async with conn.transaction():
        rows = await conn.fetch(PURGE_RAW, older_than_days)
        await conn.execute(REDACT_AUDIT, [r["workflow_id"] for r in rows])
        await conn.execute(RECORD, None, actor, "purged",
                           {"older_than_days": older_than_days, "events": len(rows)})
    return len(rows)


async def forget(conn: Conn, tenants: list[str], canonical: str,
                 actor: str) -> ForgetReport:
    async with conn.transaction():
        contacts = await conn.fetch(FORGET_CONTACTS, tenants, canonical, uuid.uuid4().hex)
        contact_ids = [r["contact_id"] for r in contacts]
        events = await conn.fetch(FORGET_EVENTS, tenants, canonical, contact_ids)
        await conn.execute(CANCEL_OPEN_INTENTS, contact_ids)
        await conn.execute(REDACT_AUDIT, [e["workflow_id"] for e in events])
        for tenant in tenants:
            await conn.execute(RECORD, tenant, actor, "forgotten", {
                "contacts": [str(c["contact_id"]) for c in contacts if c["tenant"] == tenant],
                "events": [str(e["event_id"]) for e in events if e["tenant"] == tenant],
            })
    return ForgetReport(len(contacts), len(events))
