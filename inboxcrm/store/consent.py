"""Consent from both sides (docs/consent.md): the CRM write-backs of inboxcrm's own
suppressions (`crm_consent_writes`, one operation per suppression with its own key) and the
facts the send's consent check reads.

A write-back row is queued in the suppression's own transaction (`queue_write`, called by
`suppression.suppress_identity`), so an opt-out recorded here can never miss its write to
the CRM; the scheduled ConsentSyncWorkflow claims due rows with a lease (`claim_due`), and
each attempt ends in `record_written` or `record_failed`, fenced by its claim token (the
attempt number), each with its audit entry in the same statement.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from inboxcrm.store.audit import json_safe

if TYPE_CHECKING:
    import asyncpg

    from inboxcrm.store.db import Conn

ACTION = "crm-opt-out"

QUEUE_WRITE = """
INSERT INTO crm_consent_writes (op_key, tenant, canonical_email, contact_id, reason, scope)
SELECT $1, $2, $3, (SELECT contact_id FROM contacts WHERE tenant = $2 AND canonical_email = $3),
       $4, $5
RETURNING op_key
"""

# Due rows: pending and due, or claimed by an attempt whose lease ended (a crashed sync).
# $1 tenant (NULL: every tenant), $2 batch size, $3 lease seconds.
CLAIM_DUE = """
WITH due AS (
    SELECT op_key FROM crm_consent_writes
    WHERE ($1::text IS NULL OR tenant = $1)
      AND ((status = 'pending' AND next_attempt_at <= now())
           OR (status = 'in_progress' AND lease_until < now()))
    ORDER BY next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE crm_consent_writes AS w
SET status = 'in_progress', attempts = w.attempts + 1,
    lease_until = now() + make_interval(secs => $3), last_transition = now()
FROM due
WHERE w.op_key = due.op_key
RETURNING w.op_key, w.tenant, w.canonical_email, w.contact_id, w.reason, w.scope, w.attempts,
          w.max_attempts,
          (SELECT c.crm_record_id FROM contacts c
           WHERE c.tenant = w.tenant AND c.canonical_email = w.canonical_email) AS crm_record_id
"""

# The attempt's success and its audit entry, fenced by the claim token ($2).
# $1 op_key, $2 attempt, $3 provider, $4 field, $5 record IDs, $6 audit detail.
RECORD_WRITTEN = """
WITH done AS (
    UPDATE crm_consent_writes
    SET status = 'completed', provider = $3, crm_field = $4, destination_id = $5,
        lease_until = NULL, last_error_category = NULL, last_error = NULL,
        last_transition = now()
    WHERE op_key = $1 AND status = 'in_progress' AND attempts = $2
    RETURNING tenant, contact_id
)
INSERT INTO audit_log (tenant, contact_id, actor, action, detail)
SELECT tenant, contact_id, 'consent', 'crm_opt_out_written', $6 FROM done
RETURNING true
"""

# An attempt's failure: back to `pending` after `$5` seconds, or `blocked` (permanent, or out
# of attempts), with its audit entry. $1 op_key, $2 attempt, $3 category, $4 reason,
# $5 retry delay in seconds (NULL: blocked), $6 audit detail.
RECORD_FAILED = """
WITH failed AS (
    UPDATE crm_consent_writes
    SET status = CASE WHEN $5::float8 IS NULL THEN 'blocked' ELSE 'pending' END,
        next_attempt_at = now() + make_interval(secs => coalesce($5::float8, 0)),
        lease_until = NULL, last_error_category = $3, last_error = $4,
        last_transition = now()
    WHERE op_key = $1 AND status = 'in_progress' AND attempts = $2
    RETURNING tenant, contact_id
)
INSERT INTO audit_log (tenant, contact_id, actor, action, detail)
SELECT tenant, contact_id, 'consent',
       CASE WHEN $5::float8 IS NULL THEN 'crm_opt_out_blocked' ELSE 'crm_opt_out_failed' END,
       $6 FROM failed
RETURNING true
"""

# The send's pre-read (inboxcrm/activities/send.py): the intent's status and the CRM record
# its contact has, read before the send's own transaction.
INTENT_CRM_RECORD = """
SELECT i.status, c.crm_record_id FROM followup_intents i
JOIN contacts c ON c.contact_id = i.contact_id
WHERE i.intent_id = $1::uuid
"""

# The identity's write-backs, newest first (the review card, `inboxcrm audit`).
WRITES_OF_IDENTITY = """
SELECT op_key, reason, scope, status, attempts, provider, crm_field, destination_id,
       last_error, created_at, last_transition
FROM crm_consent_writes WHERE tenant = $1 AND canonical_email = $2
ORDER BY created_at DESC
"""


def op_key(tenant: str, write_id: str) -> str:
    """`consent/{tenant}/{write_id}:crm-opt-out`: a random ID, never the address."""
    return f"consent/{tenant}/{write_id}:{ACTION}"


async def queue_write(conn: Conn, *, tenant: str, canonical_email: str, reason: str,
                      scope: str) -> str:
    """Queue the CRM write-back of a suppression just recorded (the caller's transaction).
    Returns its operation key."""
    key = op_key(tenant, str(uuid.uuid4()))
    await conn.fetchval(QUEUE_WRITE, key, tenant, canonical_email, reason, scope)
    return key


async def claim_due(conn: Conn, *, tenant: str | None, limit: int,
                    lease_seconds: float) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(CLAIM_DUE, tenant, limit, lease_seconds)
    return rows


async def record_written(conn: Conn, *, op_key: str, attempt: int, provider: str,
                         field: str, record_ids: tuple[str, ...], detail: dict[str, Any]
                         ) -> bool:
    """False: fenced off (another attempt owns the row now); nothing was written."""
    return bool(await conn.fetchval(RECORD_WRITTEN, op_key, attempt, provider, field,
                                    ",".join(record_ids), json_safe(detail)))


async def record_failed(conn: Conn, *, op_key: str, attempt: int, category: str,
                        reason: str, retry_in: float | None, detail: dict[str, Any]) -> bool:
    return bool(await conn.fetchval(RECORD_FAILED, op_key, attempt, category, reason,
                                    retry_in, json_safe(detail)))


async def intent_crm_record(conn: Conn, *, intent_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(INTENT_CRM_RECORD, intent_id)
    return row


async def writes_of_identity(conn: Conn, *, tenant: str, canonical_email: str
                             ) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(WRITES_OF_IDENTITY, tenant, canonical_email)
    return rows
