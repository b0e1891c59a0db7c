"""Retention and data-subject requests.

- purge: raw content past retention is deleted; hashes, routes, reasons and the decision
  trail stay, so "why did this happen?" can still be answered.
- forget: a person's personal data is removed from the integration store and the fact is
  recorded (without the address). The suppression row, if any, is kept: it is what honours
  their opt-out (documented in the README). The CRM's own copy is the CRM's deletion.
- retention: the scheduled run applies each tenant's periods (policy `retention`) in
  bounded batches, and every item it empties says so in its own audit trail.
- export: everything the store holds about a person, for an access request (the same rows
  `forget` would touch, and the trail around them); the export itself is recorded.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inboxcrm.platform import atrest
from inboxcrm.store import intents

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# Items still waiting for a person keep their content: the reviewer needs it.
# The provider's own event (migration 083) goes with the raw message it was rebuilt into.
PURGE_RAW = """
WITH purged AS (
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
), dropped AS (
    DELETE FROM provider_events p USING purged WHERE p.event_id = purged.event_id
)
SELECT event_id, workflow_id FROM purged
"""

FORGET_CONTACTS = """
UPDATE contacts
SET canonical_email = 'forgotten:' || $3, email = 'forgotten', name = NULL, company = NULL,
    status = 'forgotten', updated_at = now()
WHERE tenant = ANY($1::text[]) AND canonical_email = $2
RETURNING contact_id, tenant
"""

FORGET_EVENTS = """
WITH forgotten AS (
    UPDATE inbound_events
    SET raw = NULL, extraction = NULL, canonical_email = NULL, updated_at = now()
    WHERE tenant = ANY($1::text[]) AND (canonical_email = $2 OR contact_id = ANY($3::uuid[]))
    RETURNING event_id, workflow_id, tenant
), dropped AS (
    DELETE FROM provider_events p USING forgotten WHERE p.event_id = forgotten.event_id
)
SELECT event_id, workflow_id, tenant FROM forgotten
"""

REDACT_AUDIT = """
UPDATE audit_log SET detail = detail - 'evidence'
WHERE workflow_id = ANY($1::text[]) AND detail ? 'evidence'
"""

# The address's links (migration 077) and every link to a forgotten contact.
FORGET_ADDRESSES = """
DELETE FROM contact_addresses
WHERE tenant = ANY($1::text[]) AND (canonical_email = $2 OR contact_id = ANY($3::uuid[]))
"""

CANCEL_OPEN_INTENTS = """
UPDATE followup_intents SET status = 'cancelled', cancel_reason = 'forgotten'
WHERE contact_id = ANY($1::uuid[]) AND status IN ('queued', 'awaiting_approval')
"""

# A reviewer's edited draft is the person's data (migration 086): gone with them; its hash
# stays as the evidence of what was approved.
FORGET_DRAFTS = """
UPDATE followup_intents SET draft_text = NULL, draft_sha256 = NULL
WHERE contact_id = ANY($1::uuid[]) AND draft_text IS NOT NULL
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
        await conn.execute(FORGET_ADDRESSES, tenants, canonical, contact_ids)
        await conn.execute(CANCEL_OPEN_INTENTS, contact_ids)
        await conn.execute(FORGET_DRAFTS, contact_ids)
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
       content_sha256, size_bytes, raw, p.content_type AS provider_event_type,
       p.body AS provider_event
FROM inbound_events LEFT JOIN provider_events p USING (event_id)
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
       cancel_reason, provider_message_id, created_at, sent_at, draft_text,
       approved_draft_sha256
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
SELECT at, tenant, workflow_id, actor, action, detail, event_id
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
        events = [_opened(dict(r)) for r in await conn.fetch(EXPORT_EVENTS, tenants,
                                                             canonical, contact_ids)]
        event_ids = [e["event_id"] for e in events]
        found: dict[str, list[dict[str, Any]]] = {"contacts": contacts, "messages": events}
        for kind, statement in EXPORT_BY_EVENT.items():
            found[kind] = [dict(r) for r in await conn.fetch(statement, event_ids)]
        tenant_of = {e["event_id"]: str(e["tenant"]) for e in events}
        for intent in found["followups"]:  # the edited draft is sealed at rest
            intent["draft_text"] = intents.opened_draft(
                intent, tenant=tenant_of[intent["event_id"]])
        found["suppressions"] = [dict(r) for r in await conn.fetch(EXPORT_SUPPRESSIONS,
                                                                   tenants, canonical)]
        found["crm_opt_out_writes"] = [dict(r) for r in await conn.fetch(
            EXPORT_CONSENT_WRITES, tenants, canonical)]
        found["audit"] = [_opened_entry(dict(r)) for r in await conn.fetch(
            EXPORT_AUDIT, tenants, [e["workflow_id"] for e in events], contact_ids)]
    for tenant in tenants:
        await conn.execute(RECORD, tenant, actor, "exported", {
            "contacts": sum(1 for c in contacts if c["tenant"] == tenant),
            "messages": sum(1 for e in events if e["tenant"] == tenant),
        })
    return found


def _opened(event: dict[str, Any]) -> dict[str, Any]:
    """An exported message as the person sent it: its stored values opened (at rest they are
    sealed, inboxcrm/platform/atrest.py)."""
    tenant, row = str(event["tenant"]), str(event["event_id"])
    event["raw"] = atrest.open_optional(event["raw"], tenant=tenant, column=atrest.RAW, row=row)
    event["provider_event"] = atrest.open_optional(event["provider_event"], tenant=tenant,
                                                   column=atrest.PROVIDER_EVENT, row=row)
    if event["extraction"] is not None:
        event["extraction"] = atrest.open_evidence(event["extraction"], tenant=tenant,
                                                   event_id=row)
    return event


def _opened_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """An exported audit entry with the evidence it quotes opened (bound to the entry's
    event)."""
    event_id = entry.pop("event_id")
    if entry["action"] == "extracted" and isinstance(entry["detail"], dict):
        tenant = str(entry["tenant"])
        entry["detail"] = atrest.map_audit_evidence(entry["detail"], lambda q: atrest.open_text(
            q, tenant=tenant, column=atrest.AUDIT_EVIDENCE, row=str(event_id)) or q)
    return entry


# The scheduled retention run (policy `retention`), tenant by tenant, in bounded batches
# (SKIP LOCKED: a step that is writing the row keeps it until the next run). Each emptied
# item gets its own audit entry, so `inboxcrm audit --workflow` says what was removed.
RETAIN_RAW = """
WITH due AS (
    SELECT event_id FROM inbound_events
    WHERE tenant = $1 AND received_at < now() - make_interval(days => $2)
      AND raw IS NOT NULL
      AND state IN ('completed', 'ignored', 'suppressed', 'rejected', 'failed', 'shadowed')
    ORDER BY received_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), emptied AS (
    UPDATE inbound_events e
    SET raw = NULL,
        extraction = CASE WHEN e.extraction IS NULL THEN NULL ELSE jsonb_build_object(
            'intent', e.extraction -> 'intent', 'purged', true) END,
        updated_at = now()
    FROM due WHERE e.event_id = due.event_id
    RETURNING e.event_id, e.workflow_id, e.tenant
), dropped AS (
    DELETE FROM provider_events p USING emptied WHERE p.event_id = emptied.event_id
)
INSERT INTO audit_log (tenant, event_id, workflow_id, actor, action, detail)
SELECT tenant, event_id, workflow_id, $4, 'retention_applied',
       jsonb_build_object('kind', 'raw', 'older_than_days', $2::int)
FROM emptied
RETURNING workflow_id
"""

RETAIN_OPERATION_EVIDENCE = """
WITH due AS (
    SELECT o.op_key FROM operations o JOIN inbound_events e USING (event_id)
    WHERE e.tenant = $1 AND o.evidence IS NOT NULL
      AND o.last_transition < now() - make_interval(days => $2)
      AND o.status IN ('completed', 'cancelled')
    LIMIT $3
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE operations o SET evidence = NULL FROM due WHERE o.op_key = due.op_key
RETURNING o.workflow_id
"""

RETAIN_AUDIT_EVIDENCE = """
WITH due AS (
    SELECT audit_id FROM audit_log
    WHERE tenant = $1 AND detail ? 'evidence' AND at < now() - make_interval(days => $2)
    LIMIT $3
)
UPDATE audit_log a SET detail = a.detail - 'evidence' FROM due
WHERE a.audit_id = due.audit_id
RETURNING a.workflow_id
"""

# The records of what was removed (and of requests answered) outlive the trail they end.
KEPT_AUDIT_ACTIONS = ("retention_applied", "retention_run", "purged", "forgotten", "exported")

RETAIN_AUDIT = """
WITH due AS (
    SELECT audit_id FROM audit_log
    WHERE tenant = $1 AND at < now() - make_interval(days => $2)
      AND action <> ALL($4::text[])
    ORDER BY audit_id
    LIMIT $3
)
DELETE FROM audit_log a USING due WHERE a.audit_id = due.audit_id
"""


@dataclass(frozen=True)
class RetentionReport:
    raw: int = 0
    evidence: int = 0
    audit: int = 0

    def __add__(self, other: RetentionReport) -> RetentionReport:
        return RetentionReport(self.raw + other.raw, self.evidence + other.evidence,
                               self.audit + other.audit)


async def retain_batch(conn: Conn, *, tenant: str, raw_days: int | None,
                       evidence_days: int | None, audit_days: int | None, limit: int,
                       actor: str) -> RetentionReport:
    """One bounded batch of each kind that has a period, in one transaction: the counts of
    items emptied, evidence removed and audit entries deleted (all 0: nothing left due)."""
    raw = evidence = audit = 0
    async with conn.transaction():
        if raw_days is not None:
            emptied = await conn.fetch(RETAIN_RAW, tenant, raw_days, limit, actor)
            await conn.execute(REDACT_AUDIT, [r["workflow_id"] for r in emptied])
            raw = len(emptied)
        if evidence_days is not None:
            evidence = len(await conn.fetch(RETAIN_OPERATION_EVIDENCE, tenant, evidence_days,
                                            limit))
            evidence += len(await conn.fetch(RETAIN_AUDIT_EVIDENCE, tenant, evidence_days,
                                             limit))
        if audit_days is not None:
            status = await conn.execute(RETAIN_AUDIT, tenant, audit_days, limit,
                                        list(KEPT_AUDIT_ACTIONS))
            audit = int(status.split()[-1])
    return RetentionReport(raw, evidence, audit)


async def record_retention_run(conn: Conn, *, tenant: str, actor: str,
                               report: RetentionReport, periods: dict[str, int | None]) -> None:
    """The run's one entry per tenant: what it removed, under which periods."""
    await conn.execute(RECORD, tenant, actor, "retention_run", {
        "raw": report.raw, "evidence": report.evidence, "audit": report.audit,
        "periods": periods})
