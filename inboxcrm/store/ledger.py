"""The operations ledger (the outbox), shared by every side-effecting activity.

Each logical side effect has one row keyed `{workflow_id}:{action}`. An attempt *claims* the
row before calling out and records the destination's answer before it reports success, so
a crash anywhere leaves evidence the next attempt can act on:
- a completed row is never repeated: the stored result is returned;
- a row left `in_progress` (crash mid-call) or failed with an `unknown` outcome is
  reconciled against the destination before anything is sent again.

Fencing: the attempt number a claim sets (`attempts`) is the claim's token. A slow attempt
can outlive its step (a local activity's timeout only *requests* cancellation) and overlap
its own re-run; so completion, failure and lease release are written only while the row is
still `in_progress` under that token, and a `completed` or `cancelled` row is never
overwritten by anyone. A write refused by the fence tells the caller what the row says now.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from inboxcrm.schemas.models import ItemEnd
from inboxcrm.schemas.outcomes import Classified
from inboxcrm.store.audit import json_safe
from inboxcrm.store.review_tasks import settle_parts

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# One statement per attempt start: the pause switch (global or the tenant's, for this scope),
# the row-locked claim, and the item's state mirror. When paused nothing is claimed and the
# item shows `<running_state> / paused`; when the row cannot be claimed (completed,
# cancelled, out of attempts) the state is left alone and `previous` tells which.
# A scope parked by a destination's limit (`parked.crm`, until a time) counts as paused;
# `parked_until` says until when, where only such a limit (no operator's switch) holds it.
# The claim stamps the first attempt's time (`first_attempt_at`) once, and the start of the
# idempotency key's window (`key_window_from`) unless an earlier attempt that may have taken
# effect already did: an attempt that ends certainly refused gives it back
# (`record_failure(..., refused=True)`), so only attempts of unknown outcome open the window.
# $1 op_key, $2 tenant, $3 switch key (`paused.crm` / `paused.send`), $4 event_id,
# $5 running state, $6 park key (`parked.crm` / `parked.send`).
BEGIN_ATTEMPT = """
WITH limits AS (
    SELECT coalesce(bool_or(key IN ($3, 'paused.all') AND value = 'true'::jsonb), false)
               AS switched,
           max((value ->> 'until')::timestamptz) FILTER (WHERE key = $6) AS parked_until
    FROM settings
    WHERE tenant IN ('*', $2) AND key IN ($3, 'paused.all', $6)
), switch AS (
    SELECT switched OR coalesce(parked_until > now(), false) AS paused,
           CASE WHEN NOT switched AND parked_until > now() THEN parked_until END
               AS parked_until
    FROM limits
), previous AS (
    SELECT op_key, status, last_error_category, attempts, destination_id, external_ref,
           key_window_from
    FROM operations WHERE op_key = $1 FOR UPDATE
), claimed AS (
    UPDATE operations AS o
    SET status = 'in_progress', attempts = o.attempts + 1, last_transition = now(),
        first_attempt_at = coalesce(o.first_attempt_at, now()),
        key_window_from = coalesce(o.key_window_from, now())
    FROM previous, switch
    WHERE o.op_key = previous.op_key
      AND NOT switch.paused
      AND previous.status NOT IN ('completed', 'cancelled')
      AND o.attempts < o.max_attempts
    RETURNING o.attempts, o.first_attempt_at, previous.key_window_from AS window_before,
              extract(epoch FROM now() - previous.key_window_from) AS since_key_window
), mirrored AS (
    UPDATE inbound_events AS e
    SET state = $5, reason = CASE WHEN switch.paused THEN 'paused' END, updated_at = now()
    FROM switch
    WHERE e.event_id = $4 AND (switch.paused OR EXISTS (SELECT 1 FROM claimed))
)
SELECT switch.paused, switch.parked_until, previous.op_key IS NOT NULL AS found,
       claimed.attempts IS NOT NULL AS claimed,
       previous.status AS previous_status, previous.last_error_category AS previous_category,
       COALESCE(claimed.attempts, previous.attempts) AS attempts,
       previous.destination_id, previous.external_ref, claimed.first_attempt_at,
       claimed.window_before, claimed.since_key_window
FROM switch LEFT JOIN previous ON true LEFT JOIN claimed ON true
"""

GET_OPERATION = """
SELECT op_key, workflow_id, event_id, action, status, attempts, max_attempts,
       last_error_category, last_error, external_ref, destination_id, evidence
FROM operations WHERE op_key = $1
"""

# A reviewer's resolve: the side effect exists. Never rewrites a completed or cancelled row.
COMPLETE_OPERATION = """
UPDATE operations
SET status = 'completed', destination_id = $2, evidence = COALESCE($3, evidence),
    last_error_category = NULL, last_error = NULL, last_transition = now()
WHERE op_key = $1 AND status NOT IN ('completed', 'cancelled')
"""

# An attempt's success, fenced by its claim token ($3). The provider's request ID is the
# audit detail's `request_id` ($10): one value for both, no parameter more (kept when the
# attempt's last answer had none).
_COMPLETE_CLAIMED = """
UPDATE operations
SET status = 'completed', destination_id = $2, last_error_category = NULL, last_error = NULL,
    last_transition = now(),
    last_request_id = COALESCE($10::jsonb ->> 'request_id', last_request_id)
WHERE op_key = $1 AND status = 'in_progress' AND attempts = $3
RETURNING op_key
"""

_INSERT_SUCCESS_AUDIT = """
INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
SELECT $4, $5, $6, $7, $8, $9, $10 WHERE EXISTS (SELECT 1 FROM completed)
RETURNING true
"""


class AlsoRecord(enum.Enum):
    """What an action records of its own with a completed operation, in the same statement
    (`complete_attempt`): the destination's ID onto the row the operation's external
    reference names."""

    NOTHING = "nothing"
    CRM_RECORD_ON_CONTACT = "crm_record_on_contact"  # the CRM record ID onto our contact
    INTENT_SENT = "intent_sent"                      # the follow-up intent becomes `sent`


# The mirrors, in the success statement's parameters: $2 the destination ID, $11 the
# operation's external reference. Each applies only with the completed row.
_MIRRORS = {
    # With where the record came from (the detail's `crm_origin`, migration 080); a success
    # that cannot tell (reconciled) keeps the stored origin for the same record, else none.
    AlsoRecord.CRM_RECORD_ON_CONTACT: """
UPDATE contacts SET crm_record_id = $2, updated_at = now(),
    crm_origin = CASE WHEN $10::jsonb ->> 'crm_origin' IS NOT NULL
                      THEN $10::jsonb ->> 'crm_origin'
                      WHEN crm_record_id IS NOT DISTINCT FROM $2 THEN crm_origin END
WHERE contact_id = $11::uuid AND EXISTS (SELECT 1 FROM completed)
""",
    AlsoRecord.INTENT_SENT: """
UPDATE followup_intents
SET status = 'sent', provider_message_id = $2, sent_at = now(), lease_owner = NULL,
    lease_until = NULL
WHERE intent_id = $11::uuid AND EXISTS (SELECT 1 FROM completed)
""",
}

# The item's end the workflow decided, when the operation is its last step
# (`OperationInput.ends_item`), written as settling a state writes it
# (`review_tasks.settle_parts`), only with the completed row: $4 tenant, $5 event_id,
# $6 workflow_id, then the end's state and reason.
def _item_end(state: str, reason: str) -> tuple[str, str, str]:
    return settle_parts(
        event_id="$5", workflow_id="$6", tenant="$4", state=state, reason=reason,
        detail=f"jsonb_build_object('state', {state}, 'reason', {reason}, "
               f"'review_reason', NULL, 'owner', NULL)",
        guard="EXISTS (SELECT 1 FROM completed)")


def _success_statement(also: AlsoRecord, ends_item: bool) -> str:
    # The success's own audit entry is the main statement; PostgreSQL runs the WITH
    # statements it does not read once it is done, so the end's entry comes after it
    # (tests/test_item_end_with_last_step.py reads the order).
    parts = [_COMPLETE_CLAIMED]
    if also in _MIRRORS:
        parts.append(_MIRRORS[also])
    if ends_item:
        first = 12 if also in _MIRRORS else 11
        parts += _item_end(f"${first}::text", f"${first + 1}::text")
    names = ["completed"] + [f"also_{n}" for n in range(1, len(parts))]
    ctes = [f"{name} AS ({sql.strip()})" for name, sql in zip(names, parts, strict=True)]
    return f"WITH {', '.join(ctes)}\n{_INSERT_SUCCESS_AUDIT.strip()}\n"


# Complete the operation, record what the action also records (and the item's end, when the
# operation is its last step) and write the audit entry in ONE statement: a single atomic
# write, no transaction round trips.
# $1 op_key, $2 destination_id, $3 the claim token, then the audit entry: $4 tenant,
# $5 event_id, $6 workflow_id, $7 contact_id, $8 actor, $9 action, $10 detail; with a
# mirror, $11 the operation's external reference; then with an end, its state and reason.
# Returns one row (true) when the token still owned the row, none when it was fenced off.
SUCCESS_STATEMENTS = {(also, ends): _success_statement(also, ends)
                      for also in AlsoRecord for ends in (False, True)}


@dataclass(frozen=True)
class SuccessEntry:
    """The audit entry written with a completed operation."""

    tenant: str
    event_id: str
    workflow_id: str
    actor: str
    action: str
    detail: dict[str, Any]
    contact_id: str | None = None


async def complete_attempt(conn: Conn | asyncpg.Pool, op_key: str, *, token: int,
                           destination_id: str, external_ref: str | None,
                           also: AlsoRecord, entry: SuccessEntry,
                           ends_item: ItemEnd | None = None) -> bool:
    """Record an attempt's success (`SUCCESS_STATEMENTS`), with the item's end when the
    operation is its last step, if the claim `token` still owns the row. False: fenced
    off, nothing was written."""
    extra: list[Any] = [external_ref] if also in _MIRRORS else []
    if ends_item is not None:
        extra += [ends_item.state, ends_item.reason]
    owned = await conn.fetchval(
        SUCCESS_STATEMENTS[also, ends_item is not None], op_key, destination_id, token,
        entry.tenant, entry.event_id, entry.workflow_id, entry.contact_id, entry.actor,
        entry.action, json_safe(entry.detail), *extra)
    return bool(owned)


# An attempt's failure (or its cancellation, $3/$4 NULL), fenced by its claim token ($5),
# with the provider's request ID of its last answer ($6; NULL keeps the one there).
RECORD_FAILURE = """
UPDATE operations
SET status = $2, last_error_category = $3, last_error = $4, last_transition = now(),
    last_request_id = COALESCE($6, last_request_id)
WHERE op_key = $1 AND status = 'in_progress' AND attempts = $5
RETURNING op_key
"""

# The same for an attempt the destination certainly refused (nothing can have been sent): the
# key's window goes back to what it was before this attempt ($6; NULL if none was open).
RECORD_REFUSAL = """
UPDATE operations
SET status = $2, last_error_category = $3, last_error = $4, last_transition = now(),
    key_window_from = $6, last_request_id = COALESCE($7, last_request_id)
WHERE op_key = $1 AND status = 'in_progress' AND attempts = $5
RETURNING op_key
"""

# A rejected item: nothing more is written or sent.
CANCEL_EVENT_OPERATIONS = """
UPDATE operations SET status = 'cancelled', last_transition = now()
WHERE workflow_id = $1 AND status <> 'completed'
"""

# What the workflow shows of an operation (inboxcrm/activities/review.py).
OPERATION_VIEW = """
SELECT attempts, max_attempts, last_error FROM operations WHERE op_key = $1
"""

# The whole row, for probes and tests (inboxcrm/verify/probe.py).
OPERATION_ROW = "SELECT * FROM operations WHERE op_key = $1"

# What a fenced-off attempt reads to know what its row says now.
CURRENT_STATUS = "SELECT status, destination_id FROM operations WHERE op_key = $1"

# A reviewer's `retry`: a fresh, bounded budget on the same key. After an ambiguous outcome
# it also means "a person checked: it did not happen", so the next attempt sends again (same
# key, same Message-ID) instead of finding the same uncertainty. Completed and cancelled rows
# keep their status. It also starts a new idempotency-key window (the person decided the
# operation is to be done again). Returns the status and category the reviewer answered.
EXTEND_ATTEMPT_BUDGET = """
WITH previous AS (
    SELECT op_key, status, last_error_category FROM operations WHERE op_key = $1 FOR UPDATE
), granted AS (
    UPDATE operations AS o
    SET max_attempts = o.attempts + $2,
        status = CASE WHEN o.status IN ('completed', 'cancelled') THEN o.status
                      ELSE 'waiting' END,
        last_error_category = CASE
            WHEN o.status IN ('completed', 'cancelled') THEN o.last_error_category
            WHEN o.status = 'ambiguous' OR o.last_error_category = 'unknown'
                THEN 'checked_not_sent'
            ELSE o.last_error_category END,
        first_attempt_at = CASE WHEN o.status IN ('completed', 'cancelled')
                                THEN o.first_attempt_at END,
        key_window_from = CASE WHEN o.status IN ('completed', 'cancelled')
                               THEN o.key_window_from END,
        last_transition = now()
    FROM previous WHERE o.op_key = previous.op_key
)
SELECT status, last_error_category FROM previous
"""

# A destination's limit parks the tenant's scope until `until` (like a pause), and the
# attempt that met the limit is given back: waiting for a reset spends no attempt budget.
# A park already running longer is kept (a short Retry-After never ends a daily limit).
# $1 op_key, $2 category, $3 reason, $4 tenant, $5 park key, $6 park value (until, reason),
# $7 the claim token: only the attempt that still owns the row parks (fencing); $8 the key
# window as it was before this (refused) attempt.
PARK_SCOPE = """
WITH refunded AS (
    UPDATE operations
    SET status = 'waiting', attempts = greatest(attempts - 1, 0), last_error_category = $2,
        last_error = $3, last_transition = now(), key_window_from = $8
    WHERE op_key = $1 AND status = 'in_progress' AND attempts = $7
    RETURNING op_key
), parked AS (
    INSERT INTO settings (tenant, key, value, updated_by)
    SELECT $4, $5, $6, 'destination-limit' FROM refunded
    ON CONFLICT (tenant, key) DO UPDATE
    SET value = EXCLUDED.value, updated_by = EXCLUDED.updated_by, updated_at = now()
    WHERE coalesce((settings.value ->> 'until')::timestamptz, '-infinity')
          < (EXCLUDED.value ->> 'until')::timestamptz
)
SELECT op_key FROM refunded
"""


@dataclass(frozen=True)
class Claim:
    """What an attempt knows after claiming its operation row."""

    op_key: str
    already_completed: bool
    destination_id: str | None
    needs_reconcile: bool
    attempts: int                   # after a claim: this attempt's number = its claim token
    external_ref: str | None
    exhausted: bool = False
    paused: bool = False
    parked_until: datetime | None = None      # paused by a destination's limit until then
    first_attempt_at: datetime | None = None  # set on a claimed attempt
    # The idempotency key's window as it was before this attempt: opened by the first earlier
    # attempt that may have taken effect (None: every earlier attempt was certainly refused),
    # and how long ago, in seconds on the database's clock.
    key_window_from: datetime | None = None
    since_key_window: float | None = None
    cancelled: bool = False         # with already_completed: the row ended `cancelled`
    previous_category: str | None = None


class OperationNotFound(LookupError):
    pass


async def begin_attempt(conn: Conn, op_key: str, *, tenant: str, pause_scope: str,
                        event_id: str, running_state: str) -> Claim:
    """Claim the operation for this attempt unless its scope is paused, and show the item
    as `running_state`: one statement (`BEGIN_ATTEMPT`), row-locked."""
    row = await conn.fetchrow(BEGIN_ATTEMPT, op_key, tenant, f"paused.{pause_scope}", event_id,
                              running_state, f"parked.{pause_scope}")
    assert row is not None  # the statement always returns its one `switch` row
    if row["paused"]:
        return Claim(op_key, False, None, False, row["attempts"] or 0, row["external_ref"],
                     paused=True, parked_until=row["parked_until"])
    if not row["found"]:
        raise OperationNotFound(op_key)
    if row["claimed"]:
        needs_reconcile = row["previous_status"] == "in_progress" or (
            row["previous_category"] == "unknown"
        )
        return Claim(op_key, False, None, needs_reconcile, row["attempts"], row["external_ref"],
                     first_attempt_at=row["first_attempt_at"],
                     key_window_from=row["window_before"],
                     since_key_window=None if row["since_key_window"] is None
                     else float(row["since_key_window"]),
                     previous_category=row["previous_category"])
    if row["previous_status"] in ("completed", "cancelled"):
        return Claim(op_key, True, row["destination_id"], False, row["attempts"],
                     row["external_ref"], cancelled=row["previous_status"] == "cancelled")
    return Claim(op_key, False, None, False, row["attempts"], row["external_ref"],
                 exhausted=True)


async def complete(
    conn: Conn, op_key: str, destination_id: str | None,
    evidence: str | None = None,
) -> None:
    await conn.execute(COMPLETE_OPERATION, op_key, destination_id, evidence)


async def record_failure(conn: Conn, op_key: str, token: int, status: str,
                         category: str | None, reason: str | None, *,
                         refused: bool = False, window_before: datetime | None = None,
                         request_id: str | None = None) -> bool:
    """Store the failure category and a payload-free reason, if the claim `token` still owns
    the row. False: fenced off (a later attempt claimed it, or it is settled). `refused`: the
    destination certainly took nothing, so the attempt opens no key window (the window goes
    back to `window_before`, the claim's `key_window_from`). `request_id`: the provider's ID
    of the attempt's last answer (None keeps the row's)."""
    reason = reason[:200] if reason else None
    if refused:
        return await conn.fetchval(RECORD_REFUSAL, op_key, status, category, reason, token,
                                   window_before, request_id) is not None
    return await conn.fetchval(RECORD_FAILURE, op_key, status, category, reason,
                               token, request_id) is not None


async def park_scope(conn: Conn, op_key: str, token: int, classified: Classified, *,
                     tenant: str, scope: str, until: datetime,
                     window_before: datetime | None) -> bool:
    """Park `tenant`'s `scope` until `until` and give this attempt back (`PARK_SCOPE`), if
    the claim `token` still owns the row; the limit refused the request, so its key window
    goes back to `window_before`. False: fenced off, nothing written."""
    return await conn.fetchval(
        PARK_SCOPE, op_key, classified.category.value, classified.reason[:200], tenant,
        f"parked.{scope}", {"until": until.isoformat(), "reason": classified.reason[:200]},
        token, window_before) is not None


async def current_status(conn: Conn, op_key: str) -> tuple[str, str | None]:
    row = await conn.fetchrow(CURRENT_STATUS, op_key)
    if row is None:
        raise OperationNotFound(op_key)
    return row["status"], row["destination_id"]


@dataclass(frozen=True)
class RetryGranted:
    previous_status: str
    checked_not_sent: bool   # the reviewer answered an uncertain outcome: it did not happen


async def extend_attempt_budget(conn: Conn, op_key: str, budget: int) -> RetryGranted:
    """A reviewer's `retry` grants a fresh, bounded budget of attempts on the same key."""
    row = await conn.fetchrow(EXTEND_ATTEMPT_BUDGET, op_key, budget)
    if row is None:
        raise OperationNotFound(op_key)
    status = row["status"]
    uncertain = status == "ambiguous" or row["last_error_category"] == "unknown"
    return RetryGranted(status, uncertain and status not in ("completed", "cancelled"))


async def get(conn: Conn, op_key: str) -> asyncpg.Record | None:
    return await conn.fetchrow(GET_OPERATION, op_key)


async def cancel_event_operations(conn: Conn, *, workflow_id: str) -> None:
    await conn.execute(CANCEL_EVENT_OPERATIONS, workflow_id)


async def operation_view(conn: Conn | asyncpg.Pool, *, op_key: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(OPERATION_VIEW, op_key)
    return row


async def operation_row(conn: Conn | asyncpg.Pool, *, op_key: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(OPERATION_ROW, op_key)
    return row


# One planned operation of an item ($1 key, $2 workflow_id, $3 event_id, $4 action, $5 max
# attempts, $6 what it acts on: the event, or the intent): a re-run of the plan plans it
# again and changes nothing.
PLAN_OPERATION = """
INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, external_ref)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (op_key) DO NOTHING
"""


async def plan_operation(conn: Conn, *, op_key: str, workflow_id: str, event_id: str,
                         action: str, max_attempts: int, external_ref: str) -> None:
    await conn.execute(PLAN_OPERATION, op_key, workflow_id, event_id, action, max_attempts,
                       external_ref)
