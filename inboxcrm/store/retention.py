"""Retention and data-subject requests.

- purge: raw content past retention is deleted; hashes, routes, reasons and the decision
  trail stay, so "why did this happen?" can still be answered.
- forget: a person's personal data is removed from the integration store and the fact is
  recorded (without the address). The suppression row, if any, is kept: it is what honours
  their opt-out (documented in the README). The CRM's own copy is the CRM's deletion.
- export: everything the store holds about a person, for an access request (the same rows
  `forget` would touch, and the trail around them); the export itself is recorded.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


# An access request (`inboxcrm export --email`): what `forget` would touch, and around it.
EXPORT_CONTACTS = """
SELECT contact_id, tenant, canonical_email, email, name, company, status, crm_record_id,
       created_at, updated_at
FROM contacts WHERE tenant = ANY($1::text[]) AND canonical_email = $2
ORDER BY tenant, created_at
"""

EXPORT_EVENTS = """
SELECT event_id, tenant, source, mailbox, delivery_id, workflow_id, message_id, received_at,
       state, reason, route, route_reasons, extraction, canonical_email, contact_id,
       content_sha256, size_bytes, raw
FROM inbound_events
WHERE tenant = ANY($1::text[]) AND (canonical_email = $2 OR contact_id = ANY($3::uuid[]))
ORDER BY received_at, event_id
"""

EXPORT_BY_EVENT = {
    "match_decisions": """
SELECT event_id, decision, rule, contact_id, candidates, created_at
FROM match_decisions WHERE event_id = ANY($1::uuid[]) ORDER BY decision_id""",
    "review_tasks": """
SELECT event_id, workflow_id, reason, owner, status, first_seen, resolved_at, resolved_by,
       resolution
FROM review_tasks WHERE event_id = ANY($1::uuid[]) ORDER BY task_id""",
    "followups": """
SELECT intent_id, event_id, rule_id, rule_version, template_id, status, approved_by,
       cancel_reason, provider_message_id, created_at, sent_at
FROM followup_intents WHERE event_id = ANY($1::uuid[]) ORDER BY created_at""",
    "operations": """
SELECT op_key, event_id, action, status, attempts, external_ref, destination_id,
       first_seen, last_transition
FROM operations WHERE event_id = ANY($1::uuid[]) ORDER BY first_seen, op_key""",
    "copies": """
SELECT event_id, source, mailbox, delivery_id, received_at
FROM inbound_copies WHERE event_id = ANY($1::uuid[]) ORDER BY copy_row""",
}

EXPORT_SUPPRESSIONS = """
SELECT tenant, reason, source, scope, created_at
FROM suppressions WHERE tenant = ANY($1::text[]) AND canonical_email = $2
"""

EXPORT_CONSENT_WRITES = """
SELECT tenant, reason, scope, status, provider, crm_field, created_at
FROM crm_consent_writes WHERE tenant = ANY($1::text[]) AND canonical_email = $2
ORDER BY created_at
"""

EXPORT_AUDIT = """
SELECT at, tenant, workflow_id, actor, action, detail
FROM audit_log
WHERE tenant = ANY($1::text[])
  AND (workflow_id = ANY($2::text[]) OR contact_id = ANY($3::uuid[]))
ORDER BY audit_id
"""


async def export(conn: Conn, tenants: list[str], canonical: str,
                 actor: str) -> dict[str, list[dict[str, Any]]]:
    """Every row about the person whose canonical address is `canonical`, by kind. The
    export is audited per tenant with its counts (never the address)."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        contacts = [dict(r) for r in await conn.fetch(EXPORT_CONTACTS, tenants, canonical)]
        contact_ids = [c["contact_id"] for c in contacts]
        events = [dict(r) for r in await conn.fetch(EXPORT_EVENTS, tenants, canonical,
                                                    contact_ids)]
        event_ids = [e["event_id"] for e in events]
        found: dict[str, list[dict[str, Any]]] = {"contacts": contacts, "messages": events}
        for kind, statement in EXPORT_BY_EVENT.items():
            found[kind] = [dict(r) for r in await conn.fetch(statement, event_ids)]
        found["suppressions"] = [dict(r) for r in await conn.fetch(EXPORT_SUPPRESSIONS,
                                                                   tenants, canonical)]
        found["crm_opt_out_writes"] = [dict(r) for r in await conn.fetch(
            EXPORT_CONSENT_WRITES, tenants, canonical)]
        found["audit"] = [dict(r) for r in await conn.fetch(
            EXPORT_AUDIT, tenants, [e["workflow_id"] for e in events], contact_ids)]
    for tenant in tenants:
        await conn.execute(RECORD, tenant, actor, "exported", {
            "contacts": sum(1 for c in contacts if c["tenant"] == tenant),
            "messages": sum(1 for e in events if e["tenant"] == tenant),
        })
    return found
