"""The `followup_intents` table: at most one follow-up per event and rule version, leased
by the send step while it submits (docs/architecture.md §2, §6)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

from inboxcrm.platform import atrest
from inboxcrm.store.step_attempts import end_step_cte

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# --- planning (inboxcrm/activities/match.py) ------------------------------------------------------

def blockers_sql(*, tenant: str, canonical_email: str, contact_id: str, event_id: str,
                 quiet_seconds: str) -> str:
    """The two facts as SQL select-list items `suppressed` and `recent`, written once for
    FOLLOWUP_BLOCKERS and the planner's facts (`matches.PLAN_FACTS`). The arguments are the
    statement's parameter placeholders. A NULL quiet period (no rule) makes `recent` false."""
    # A `marketing` suppression (docs/consent.md) stops only the tenant's marketing rules:
    # `suppressed` is every other one, `marketing_suppressed` that one.
    return (f"EXISTS (SELECT 1 FROM suppressions WHERE tenant = {tenant} "
            f"AND canonical_email = {canonical_email} AND scope = 'all') AS suppressed,\n"
            f"       EXISTS (SELECT 1 FROM suppressions WHERE tenant = {tenant} "
            f"AND canonical_email = {canonical_email} AND scope = 'marketing') "
            f"AS marketing_suppressed,\n"
            f"       EXISTS (SELECT 1 FROM followup_intents WHERE contact_id = {contact_id} "
            f"AND event_id <> {event_id} AND status <> 'cancelled' "
            f"AND created_at > now() - make_interval(secs => {quiet_seconds})) AS recent")


# What stops a follow-up for an active contact: a suppression of the identity, or another
# event's live intent for this contact, under any rule, within the rule's quiet period (one
# follow-up per contact per quiet period, as the README and policies/README.md promise).
# $1 tenant, $2 canonical email, $3 contact_id, $4 this event, $5 quiet period in seconds.
FOLLOWUP_BLOCKERS = "SELECT " + blockers_sql(
    tenant="$1", canonical_email="$2", contact_id="$3", event_id="$4", quiet_seconds="$5")

# The planned follow-up in ONE statement (the planner's last): the template version its words
# are stored under (written once per tenant and version), the intent, the send operation and
# its audit entry, and the cleared attempt count of the planning step
# (inboxcrm/activities/step_attempts.py). The intent is inserted or (a re-run) the one
# already there:
# that second branch reads the statement's snapshot, and a row a concurrent run committed
# meanwhile is not in it, which cannot happen while this transaction holds the event row
# (events.START_MATCHING). $1 event_id, $2 tenant, $3 contact_id, $4 rule_id,
# $5 rule_version, $6 template ref, $7 status, $8 needs_approval, $9 why it needs approval
# beyond the policy (`ramp_limit`) or NULL, $10 the template's sources, $11 the send's op
# key, $12 workflow_id, $13 action, $14 max attempts, $15 the audit detail (the intent's own
# fields are added here), $16 the planning step's name, $17 what the ramp's hour row records
# (`granted`, `held`; NULL: no ramp), the row the planner's facts locked
# (`matches.PLAN_FACTS`). Returns the intent (one row).
PLAN_FOLLOWUP = f"""
WITH saved AS (
    INSERT INTO template_versions (tenant, template_ref, sources) VALUES ($2, $6, $10)
    ON CONFLICT (tenant, template_ref) DO NOTHING
), inserted AS (
    INSERT INTO followup_intents (event_id, tenant, contact_id, rule_id, rule_version,
                                  template_id, status, needs_approval, approval_reason)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    ON CONFLICT (event_id, rule_id, rule_version) WHERE generation = 1 DO NOTHING
    RETURNING intent_id, status, needs_approval, approval_reason
), intent AS (
    SELECT intent_id, status, needs_approval, approval_reason FROM inserted
    UNION ALL
    SELECT intent_id, status, needs_approval, approval_reason FROM followup_intents
    WHERE event_id = $1 AND rule_id = $4 AND rule_version = $5 AND generation = 1
      AND NOT EXISTS (SELECT 1 FROM inserted)
), queued AS (
    INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, external_ref)
    SELECT $11, $12, $1, $13, $14, intent_id::text FROM intent
    ON CONFLICT (op_key) DO NOTHING
), audited AS (
    INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
    SELECT $2, $1, $12, $3, 'planner', 'intent_created',
           $15::jsonb || jsonb_build_object('intent_id', intent_id::text,
                                            'needs_approval', needs_approval,
                                            'approval_reason', approval_reason)
    FROM intent
), ramped AS (
    UPDATE ramp_hours SET granted = granted + (CASE WHEN $17 = 'granted' THEN 1 ELSE 0 END),
                          held = held + (CASE WHEN $17 = 'held' THEN 1 ELSE 0 END)
    WHERE tenant = $2 AND hour_start = date_trunc('hour', now()) AND $17::text IS NOT NULL
), {end_step_cte("$12", "$16")}
SELECT intent_id, status, needs_approval, approval_reason FROM intent
"""

# --- the send step (inboxcrm/activities/send.py) -------------------------------------------
# The contact row first (FOR SHARE): an opt-out locks it FOR UPDATE before it writes the
# suppression, so eligibility and the lease below never interleave with one.
LOCK_CONTACT_OF_INTENT = """
SELECT c.contact_id FROM contacts c JOIN followup_intents i ON i.contact_id = c.contact_id
WHERE i.intent_id = $1::uuid
FOR SHARE OF c
"""

# The intent, its contact and eligibility, and the languages the item's message names ($2;
# as extraction stored them, migration 041, or for an item extracted before that the stored
# message, to read them from: the whole sealed value, opened by `atrest.open_head`), the
# inbound message's Message-ID and thread (what the follow-up answers, migration 073), the
# intent row-locked.
CLAIM_INTENT = """
SELECT i.intent_id, i.contact_id, i.status, i.template_id, i.rule_id, i.lease_owner,
       i.provider_message_id, i.sent_at, i.draft_text, i.draft_sha256,
       i.approved_draft_sha256,
       extract(epoch FROM i.lease_until - clock_timestamp()) AS lease_remaining,
       c.status AS contact_status, c.email, c.name, c.company, c.tenant, c.canonical_email,
       EXISTS (SELECT 1 FROM suppressions s
               WHERE s.tenant = c.tenant AND s.canonical_email = c.canonical_email)
           AS suppressed,
       (SELECT s.scope FROM suppressions s
        WHERE s.tenant = c.tenant AND s.canonical_email = c.canonical_email)
           AS suppression_scope,
       e.languages, e.message_id AS inbound_message_id, e.thread_refs,
       e.event_id AS head_event_id, CASE WHEN e.languages IS NULL THEN e.raw END AS head
FROM followup_intents i JOIN contacts c ON c.contact_id = i.contact_id
LEFT JOIN inbound_events e ON e.event_id = $2::uuid
WHERE i.intent_id = $1::uuid
FOR UPDATE OF i
"""

# The lease and the audit entry of the eligibility check that allowed it, in one statement:
# $1 intent, $2 lease owner (the attempt), $3 lease seconds, $4 tenant, $5 event_id,
# $6 workflow_id, $7 audit detail.
TAKE_LEASE = """
WITH leased AS (
    UPDATE followup_intents
    SET status = 'sending', lease_owner = $2, lease_until = now() + make_interval(secs => $3)
    WHERE intent_id = $1::uuid
)
INSERT INTO audit_log (tenant, event_id, workflow_id, actor, action, detail)
VALUES ($4, $5, $6, 'send', 'eligibility_checked', $7)
"""

# A cancelled intent takes the log of its follow-up in the CRM (`crm-sent`, keyed by the
# intent) with it: that operation will never run, and must not stay pending.
CANCEL_INTENT = """
WITH intent AS (
    UPDATE followup_intents SET status = 'cancelled', cancel_reason = $2
    WHERE intent_id = $1::uuid
)
UPDATE operations SET status = 'cancelled', last_transition = now()
WHERE action = 'crm-sent' AND external_ref = $1::uuid::text AND status = 'pending'
"""

# Only the attempt that holds the lease releases it ($2, the lease owner).
RELEASE_LEASE = """
UPDATE followup_intents SET status = 'queued', lease_owner = NULL, lease_until = NULL
WHERE intent_id = $1::uuid AND status = 'sending' AND lease_owner = $2
"""

# --- reviewer decisions (inboxcrm/activities/review.py, inboxcrm/activities/bookkeeping.py)
# A reviewer's resolve of a send names the provider's message ($1 op key, $2 message ID).
RECORD_RESOLVED_SEND = """
UPDATE followup_intents SET status = 'sent', provider_message_id = $2,
    sent_at = COALESCE(sent_at, now()), lease_owner = NULL, lease_until = NULL
FROM operations o
WHERE o.op_key = $1 AND o.action = 'send' AND followup_intents.intent_id = o.external_ref::uuid
"""

# $3: the SHA-256 of the edited draft the approval binds (migration 086), or NULL: the
# rendered words. The send uses the stored draft only while it is that text.
APPROVE_INTENT = """
UPDATE followup_intents SET status = 'queued', approved_by = $2,
    approved_draft_sha256 = $3::text
WHERE intent_id = $1::uuid AND status = 'awaiting_approval'
"""

# --- edited drafts (docs/architecture.md §6, "Edited drafts"; migration 086) ---------------
# What checking a draft of intent $1 needs: its tenant, rule, contact and status, and the
# stored draft's hash (the text itself is read only where it is checked or sent).
DRAFT_FACTS = """
SELECT intent_id, tenant, rule_id, contact_id, status, draft_sha256, draft_text
FROM followup_intents WHERE intent_id = $1::uuid
"""

# The follow-up intent $2 of workflow $1 awaiting approval (a draft is proposed for the item
# it is shown on), or none.
INTENT_OF_WORKFLOW = """
SELECT i.intent_id FROM followup_intents i JOIN inbound_events e ON e.event_id = i.event_id
WHERE e.workflow_id = $1 AND i.status = 'awaiting_approval'
  AND ($2::uuid IS NULL OR i.intent_id = $2::uuid)
ORDER BY i.created_at DESC LIMIT 1
"""

# A reviewer's proposed text ($2, its hash $3, by $4) for intent $1 while it awaits
# approval; it replaces an earlier proposal. Returns the intent (no row: not awaiting).
SAVE_DRAFT = """
UPDATE followup_intents SET draft_text = $2, draft_sha256 = $3, draft_proposed_by = $4
WHERE intent_id = $1::uuid AND status = 'awaiting_approval'
RETURNING intent_id
"""

# Approved without its follow-up: the intent and its send operation are cancelled together.
DECLINE_INTENT = """
WITH intent AS (
    UPDATE followup_intents SET status = 'cancelled', cancel_reason = 'reviewer_declined'
    WHERE intent_id = $1::uuid AND status IN ('queued', 'awaiting_approval')
)
UPDATE operations SET status = 'cancelled', last_transition = now()
WHERE (op_key = $2 OR (action = 'crm-sent' AND external_ref = $1::uuid::text))
  AND status NOT IN ('completed', 'in_progress')
"""

# A rejected item sends nothing more. An intent left `sending` is one whose send a person
# found unconfirmed and rejected (the workflow waits, so no attempt holds it): cancelled too,
# its lease given up, and its reason says the email may exist (the decision is in the audit).
CANCEL_EVENT_INTENTS = """
UPDATE followup_intents
SET status = 'cancelled', lease_owner = NULL, lease_until = NULL,
    cancel_reason = CASE status WHEN 'sending' THEN 'rejected_unconfirmed' ELSE 'rejected' END
WHERE event_id = $1 AND status IN ('queued', 'awaiting_approval', 'sending')
"""


# --- send-again (inboxcrm/activities/review.py, bookkeeping.py; migration 082) --------------
# What a deliberate second send of the follow-up behind send operation $1 depends on: the
# intent it would repeat (its status, generation, rule), whether it was repeated already and
# the contact's status; the suppression and quiet period are `followup_blockers`' (the
# planner's own facts).
SEND_AGAIN_FACTS = """
SELECT i.intent_id, i.event_id, i.tenant, i.contact_id, i.rule_id, i.status, i.generation,
       c.status AS contact_status, c.canonical_email,
       (SELECT r.intent_id FROM followup_intents r WHERE r.repeats_intent_id = i.intent_id)
           AS repeated_by
FROM operations o
JOIN followup_intents i ON i.intent_id = o.external_ref::uuid
JOIN contacts c ON c.contact_id = i.contact_id
WHERE o.op_key = $1 AND o.action = 'send'
"""

# The new intent (generation $2, repeating the intent behind send operation $1), approved by
# $3 for reason $4, with its send operation ($5 op key, $6 max attempts), its log in the CRM
# ($7 op key or NULL, $8 max attempts), the first send's log cancelled, and the audit entry
# `followup_send_again_approved` ($9 workflow_id), in one statement. Idempotent: a re-run
# (or a redelivered decision) finds the intent of that generation, or the one that already
# repeats the same intent, and creates nothing more. Returns the new intent (one row).
PLAN_SEND_AGAIN = """
WITH repeated AS (
    SELECT i.* FROM operations o JOIN followup_intents i ON i.intent_id = o.external_ref::uuid
    WHERE o.op_key = $1 AND o.action = 'send'
), inserted AS (
    INSERT INTO followup_intents (event_id, tenant, contact_id, rule_id, rule_version,
                                  template_id, status, needs_approval, approved_by,
                                  generation, repeats_intent_id, repeat_reason,
                                  repeat_approved_at)
    SELECT event_id, tenant, contact_id, rule_id, rule_version, template_id, 'queued', true,
           $3, $2, intent_id, $4, now()
    FROM repeated
    ON CONFLICT DO NOTHING
    RETURNING intent_id, event_id, tenant, contact_id, repeats_intent_id, generation
), intent AS (
    SELECT intent_id, event_id, tenant, contact_id, repeats_intent_id, generation
    FROM inserted
    UNION ALL
    SELECT r.intent_id, r.event_id, r.tenant, r.contact_id, r.repeats_intent_id, r.generation
    FROM followup_intents r JOIN repeated ON r.repeats_intent_id = repeated.intent_id
    WHERE NOT EXISTS (SELECT 1 FROM inserted)
), send_op AS (
    INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, external_ref)
    SELECT $5, $9, event_id, 'send', $6, intent_id::text FROM intent
    ON CONFLICT (op_key) DO NOTHING
), log_op AS (
    INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, external_ref)
    SELECT $7, $9, event_id, 'crm-sent', $8, intent_id::text FROM intent
    WHERE $7::text IS NOT NULL
    ON CONFLICT (op_key) DO NOTHING
), unlogged AS (
    -- The first send's log in the CRM never runs (its send is not confirmed): cancelled,
    -- as a cancelled intent's is (`CANCEL_INTENT`); the new intent has its own.
    UPDATE operations SET status = 'cancelled', last_transition = now()
    WHERE action = 'crm-sent' AND status = 'pending'
      AND external_ref = (SELECT intent_id::text FROM repeated)
      AND EXISTS (SELECT 1 FROM inserted)
), audited AS (
    INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
    SELECT tenant, event_id, $9, contact_id, $3, 'followup_send_again_approved',
           jsonb_build_object('intent_id', intent_id::text,
                              'repeats_intent_id', repeats_intent_id::text,
                              'generation', generation, 'op_key', $5::text,
                              'repeats_op_key', $1::text, 'reason', $4::text,
                              'approved_by', $3::text)
    FROM inserted
)
SELECT intent_id, generation FROM intent
"""


async def send_again_facts(conn: Conn, *, op_key: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(SEND_AGAIN_FACTS, op_key)
    return row


async def plan_send_again(conn: Conn, *, op_key: str, generation: int, approved_by: str,
                          reason: str, send_op_key: str, send_max_attempts: int,
                          sent_op_key: str | None, log_max_attempts: int,
                          workflow_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        PLAN_SEND_AGAIN, op_key, generation, approved_by, reason, send_op_key,
        send_max_attempts, sent_op_key, log_max_attempts, workflow_id)
    return row


async def followup_blockers(conn: Conn, *, tenant: str, canonical_email: str,
                            contact_id: Any, event_id: Any,
                            quiet_period_hours: float) -> tuple[bool, bool, bool]:
    """(suppressed, recent, marketing_suppressed) for a follow-up to this identity and contact
    (`FOLLOWUP_BLOCKERS`): asked by the planner in its transaction and by the review card,
    so both see the same facts. `contact_id` None: a new contact, which has no intents."""
    row = await conn.fetchrow(FOLLOWUP_BLOCKERS, tenant, canonical_email, contact_id, event_id,
                              float(quiet_period_hours * 3600))
    assert row is not None  # one row always (three EXISTS)
    return bool(row["suppressed"]), bool(row["recent"]), bool(row["marketing_suppressed"])


async def plan_followup(
    conn: Conn, *, event_id: Any, tenant: str, contact_id: Any, rule_id: str,
    rule_version: int, template_ref: str, status: str, needs_approval: bool,
    approval_reason: str | None, template_sources: dict[str, Any], send_op_key: str,
    workflow_id: str, action: str, max_attempts: int, audit_detail: dict[str, Any],
    step: str, ramp: str | None,
) -> asyncpg.Record | None:
    """The planned follow-up (`PLAN_FOLLOWUP`): the intent, as inserted or already there."""
    row: asyncpg.Record | None = await conn.fetchrow(
        PLAN_FOLLOWUP, event_id, tenant, contact_id, rule_id, rule_version, template_ref,
        status, needs_approval, approval_reason, template_sources, send_op_key, workflow_id,
        action, max_attempts, audit_detail, step, ramp)
    return row


async def lock_contact_of_intent(conn: Conn, *, intent_id: str) -> None:
    await conn.fetch(LOCK_CONTACT_OF_INTENT, intent_id)


async def claim_intent(conn: Conn, *, intent_id: str, event_id: str | None
                       ) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(CLAIM_INTENT, intent_id, event_id)
    return row


async def take_lease(conn: Conn, *, intent_id: str, lease_owner: str, lease_seconds: float,
                     tenant: str, event_id: str, workflow_id: str,
                     audit_detail: dict[str, Any]) -> None:
    await conn.execute(TAKE_LEASE, intent_id, lease_owner, lease_seconds, tenant, event_id,
                       workflow_id, audit_detail)


async def cancel_intent(conn: Conn, *, intent_id: str, cancel_reason: str) -> None:
    await conn.execute(CANCEL_INTENT, intent_id, cancel_reason)


async def release_lease(conn: Conn, *, intent_id: str, lease_owner: str) -> None:
    await conn.execute(RELEASE_LEASE, intent_id, lease_owner)


async def record_resolved_send(conn: Conn, *, op_key: str, provider_message_id: str) -> None:
    await conn.execute(RECORD_RESOLVED_SEND, op_key, provider_message_id)


async def approve_intent(conn: Conn, *, intent_id: str, approved_by: str,
                         draft_sha256: str | None = None) -> None:
    await conn.execute(APPROVE_INTENT, intent_id, approved_by, draft_sha256)


async def draft_facts(conn: Conn, *, intent_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(DRAFT_FACTS, intent_id)
    return row


async def intent_of_workflow(conn: Conn, *, workflow_id: str,
                             intent_id: str | None = None) -> str | None:
    """The item's follow-up awaiting approval (`intent_id`: only if it is that one)."""
    found = await conn.fetchval(INTENT_OF_WORKFLOW, workflow_id, intent_id)
    return str(found) if found is not None else None


async def save_draft(conn: Conn, *, intent_id: str, tenant: str, draft_text: str,
                     draft_sha256: str, proposed_by: str) -> bool:
    """Store a reviewer's proposed text, sealed at rest (inboxcrm/platform/atrest.py; its
    hash is over the plaintext); False: the intent no longer awaits approval."""
    sealed = atrest.seal_text(draft_text, tenant=tenant, column=atrest.DRAFT, row=intent_id)
    return await conn.fetchval(SAVE_DRAFT, intent_id, sealed, draft_sha256,
                               proposed_by) is not None


def opened_draft(row: asyncpg.Record | dict[str, Any], *, tenant: str) -> str | None:
    """The plaintext of a row's `draft_text` (sealed at rest, bound to its `intent_id`;
    None: no draft)."""
    value = row["draft_text"]
    return atrest.open_text(None if value is None else str(value), tenant=tenant,
                            column=atrest.DRAFT, row=str(row["intent_id"]))


async def decline_intent(conn: Conn, *, intent_id: str, send_op_key: str) -> None:
    await conn.execute(DECLINE_INTENT, intent_id, send_op_key)


async def cancel_event_intents(conn: Conn, *, event_id: str) -> None:
    await conn.execute(CANCEL_EVENT_INTENTS, event_id)


# --- threads (migration 073, docs/architecture.md §5 "Threads") --------------------------
# A message is a reply in a thread we know when the IDs it names (`inbound_events.thread_refs`)
# include the Message-ID of one of the tenant's follow-ups or of an earlier inbound message
# of the tenant. Never across tenants.
# The thread of event $1: the newest message it names that we know, ours first (a
# follow-up: `via = 'followup'`, its intent's event), else an earlier inbound message's
# event (`via = 'inbound'`). No row: not a reply in a known thread (or extracted before 073).
THREAD_OF_EVENT = """
WITH me AS (
    SELECT event_id, tenant, thread_refs FROM inbound_events
    WHERE event_id = $1 AND cardinality(thread_refs) > 0
), named AS (
    SELECT 'followup' AS via, i.event_id, i.contact_id,
           array_position(me.thread_refs, i.message_id) AS pos
    FROM me JOIN followup_intents i
      ON i.tenant = me.tenant AND i.message_id = ANY (me.thread_refs)
    UNION ALL
    SELECT 'inbound', e.event_id, NULL, array_position(me.thread_refs, e.message_id)
    FROM me JOIN inbound_events e
      ON e.tenant = me.tenant AND e.message_id = ANY (me.thread_refs)
     AND e.event_id <> me.event_id
)
SELECT via, event_id, contact_id FROM named
ORDER BY via = 'followup' DESC, pos DESC
LIMIT 1
"""

# The Message-ID a follow-up goes out with, set as its send takes the lease ($1 intent,
# $2 Message-ID): the same on every attempt, so a retry never changes it.
RECORD_MESSAGE_ID = """
UPDATE followup_intents SET message_id = $2
WHERE intent_id = $1::uuid AND message_id IS DISTINCT FROM $2
"""


async def thread_of_event(conn: Conn, *, event_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(THREAD_OF_EVENT, event_id)
    return row


async def record_message_id(conn: Conn, *, intent_id: str, message_id: str) -> None:
    await conn.execute(RECORD_MESSAGE_ID, intent_id, message_id)


# --- `inboxcrm report rule-change` (inboxcrm/cli/report.py) --------------------------------
# The versions rule $1 was planned under ($2 tenant, NULL: every tenant): each stored
# `rule_version` with the template reference it was planned with (the stored version derives
# from the rule's number and those words, `domain.templates.rule_version`), how many intents
# and when. A report, not the per-item path: it reads the whole table for the rule.
RULE_VERSIONS = """
SELECT rule_version, template_id, count(*) AS items, min(created_at) AS first_planned,
       max(created_at) AS last_planned
FROM followup_intents
WHERE rule_id = $1 AND ($2::text IS NULL OR tenant = $2)
GROUP BY rule_version, template_id
ORDER BY min(created_at)
"""

# The items whose intent for rule $1 was planned under one of the stored versions $3 ($2
# tenant or NULL), oldest plan first, at most $4.
ITEMS_UNDER_VERSIONS = """
SELECT e.workflow_id, e.tenant, e.state, i.status AS intent_status, i.rule_version,
       i.template_id, i.created_at AS planned_at
FROM followup_intents i JOIN inbound_events e ON e.event_id = i.event_id
WHERE i.rule_id = $1 AND ($2::text IS NULL OR i.tenant = $2)
  AND i.rule_version = ANY($3::int[])
ORDER BY i.created_at, e.workflow_id
LIMIT $4
"""


async def rule_versions(conn: Conn, *, rule_id: str, tenant: str | None
                        ) -> list[asyncpg.Record]:
    return list(await conn.fetch(RULE_VERSIONS, rule_id, tenant))


async def items_under_versions(conn: Conn, *, rule_id: str, tenant: str | None,
                               rule_versions: list[int], limit: int) -> list[asyncpg.Record]:
    return list(await conn.fetch(ITEMS_UNDER_VERSIONS, rule_id, tenant, rule_versions, limit))
