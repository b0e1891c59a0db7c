"""The operations ledger (the outbox), shared by every side-effecting activity.

Each logical side effect has one row keyed `{workflow_id}:{action}`. An attempt *claims* the
row before calling out and records the destination's answer before it reports success, so
a crash anywhere leaves evidence the next attempt can act on:
- a completed row is never repeated: the stored result is returned;
- a row left `in_progress` (crash mid-call) or failed with an `unknown` outcome is
  reconciled against the destination before anything is sent again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import asyncpg

from schemas.outcomes import Classified

if TYPE_CHECKING:
    from inboxcrm.store.queries import Conn

# One statement per attempt start: the pause switch (global or the tenant's, for this scope),
# the row-locked claim, and the item's state mirror. When paused nothing is claimed and the
# item shows `<running_state> / paused`; when the row cannot be claimed (completed,
# cancelled, out of attempts) the state is left alone and `previous` tells which.
# A scope parked by a destination's limit (`parked.crm`, until a time) counts as paused.
# The claim stamps the first attempt's time (`first_attempt_at`) once.
# $1 op_key, $2 tenant, $3 switch key (`paused.crm` / `paused.send`), $4 event_id,
# $5 running state, $6 park key (`parked.crm` / `parked.send`).
BEGIN_ATTEMPT = """
WITH switch AS (
    SELECT EXISTS (
        SELECT 1 FROM settings
        WHERE tenant IN ('*', $2)
          AND ((key IN ($3, 'paused.all') AND value = 'true'::jsonb)
               OR (key = $6 AND (value ->> 'until')::timestamptz > now()))
    ) AS paused
), previous AS (
    SELECT op_key, status, last_error_category, attempts, destination_id, external_ref
    FROM operations WHERE op_key = $1 FOR UPDATE
), claimed AS (
    UPDATE operations AS o
    SET status = 'in_progress', attempts = o.attempts + 1, last_transition = now(),
        first_attempt_at = coalesce(o.first_attempt_at, now())
    FROM previous, switch
    WHERE o.op_key = previous.op_key
      AND NOT switch.paused
      AND previous.status NOT IN ('completed', 'cancelled')
      AND o.attempts < o.max_attempts
    RETURNING o.attempts, o.first_attempt_at,
              extract(epoch FROM now() - o.first_attempt_at) AS since_first_attempt
), mirrored AS (
    UPDATE inbound_events AS e
    SET state = $5, reason = CASE WHEN switch.paused THEN 'paused' END, updated_at = now()
    FROM switch
    WHERE e.event_id = $4 AND (switch.paused OR EXISTS (SELECT 1 FROM claimed))
)
SELECT switch.paused, previous.op_key IS NOT NULL AS found,
       claimed.attempts IS NOT NULL AS claimed,
       previous.status AS previous_status, previous.last_error_category AS previous_category,
       COALESCE(claimed.attempts, previous.attempts) AS attempts,
       previous.destination_id, previous.external_ref, claimed.first_attempt_at,
       claimed.since_first_attempt
FROM switch LEFT JOIN previous ON true LEFT JOIN claimed ON true
"""

GET_OPERATION = """
SELECT op_key, workflow_id, event_id, action, status, attempts, max_attempts,
       last_error_category, last_error, external_ref, destination_id, evidence
FROM operations WHERE op_key = $1
"""

COMPLETE_OPERATION = """
UPDATE operations
SET status = 'completed', destination_id = $2, evidence = COALESCE($3, evidence),
    last_error_category = NULL, last_error = NULL, last_transition = now()
WHERE op_key = $1
"""

_INSERT_SUCCESS_AUDIT = """
INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
VALUES ($4, $5, $6, $7, $8, $9, $10)
"""


def success_statement(mirror: str | None = None) -> str:
    """Complete the operation and write its audit entry in ONE statement: a single atomic
    write, no transaction round trips. `mirror` is the action's own record of the result
    (e.g. the CRM record ID on the contact), a data-modifying statement that runs with them;
    in it $2 is the destination ID and $11 the operation's external reference.
    Parameters: $1 op_key, $2 destination_id, $3 evidence, then the audit entry: $4 tenant,
    $5 event_id, $6 workflow_id, $7 contact_id, $8 actor, $9 action, $10 detail."""
    ctes = [f"completed AS ({COMPLETE_OPERATION.strip()})"]
    if mirror:
        ctes.append(f"mirrored AS ({mirror.strip()})")
    return f"WITH {', '.join(ctes)}\n{_INSERT_SUCCESS_AUDIT.strip()}\n"


RECORD_FAILURE = """
UPDATE operations
SET status = $2, last_error_category = $3, last_error = $4, last_transition = now()
WHERE op_key = $1
"""

SET_STATUS = """
UPDATE operations SET status = $2, last_transition = now() WHERE op_key = $1
"""

# A reviewer's retry also starts a new idempotency-key window: the person has looked at the
# destination and decided that this operation is to be done (again).
EXTEND_ATTEMPT_BUDGET = """
UPDATE operations
SET max_attempts = attempts + $2, status = CASE WHEN status = 'completed' THEN status
                                            ELSE 'waiting' END,
    first_attempt_at = CASE WHEN status = 'completed' THEN first_attempt_at END,
    last_transition = now()
WHERE op_key = $1
"""

# A destination's limit parks the tenant's scope until `until` (like a pause), and the
# attempt that met the limit is given back: waiting for a reset spends no attempt budget.
# $1 op_key, $2 category, $3 reason, $4 tenant, $5 park key, $6 park value (until, reason).
PARK_SCOPE = """
WITH refunded AS (
    UPDATE operations
    SET status = 'waiting', attempts = greatest(attempts - 1, 0), last_error_category = $2,
        last_error = $3, last_transition = now()
    WHERE op_key = $1
)
INSERT INTO settings (tenant, key, value, updated_by)
VALUES ($4, $5, $6, 'destination-limit')
ON CONFLICT (tenant, key) DO UPDATE
SET value = EXCLUDED.value, updated_by = EXCLUDED.updated_by, updated_at = now()
"""


@dataclass(frozen=True)
class Claim:
    """What an attempt knows after claiming its operation row."""

    op_key: str
    already_completed: bool
    destination_id: str | None
    needs_reconcile: bool
    attempts: int
    external_ref: str | None
    exhausted: bool = False
    paused: bool = False
    first_attempt_at: datetime | None = None  # set on a claimed attempt
    since_first_attempt: float = 0.0          # seconds, on the database's clock


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
                     paused=True)
    if not row["found"]:
        raise OperationNotFound(op_key)
    if row["claimed"]:
        needs_reconcile = row["previous_status"] == "in_progress" or (
            row["previous_category"] == "unknown"
        )
        return Claim(op_key, False, None, needs_reconcile, row["attempts"], row["external_ref"],
                     first_attempt_at=row["first_attempt_at"],
                     since_first_attempt=float(row["since_first_attempt"] or 0))
    if row["previous_status"] in ("completed", "cancelled"):
        return Claim(op_key, True, row["destination_id"], False, row["attempts"],
                     row["external_ref"])
    return Claim(op_key, False, None, False, row["attempts"], row["external_ref"],
                 exhausted=True)


async def complete(
    conn: Conn, op_key: str, destination_id: str | None,
    evidence: str | None = None,
) -> None:
    await conn.execute(COMPLETE_OPERATION, op_key, destination_id, evidence)


async def record_failure(
    conn: Conn, op_key: str, classified: Classified, status: str
) -> None:
    """Store the failure category and a payload-free reason."""
    await conn.execute(
        RECORD_FAILURE, op_key, status, classified.category.value, classified.reason[:200]
    )


async def park_scope(conn: Conn, op_key: str, classified: Classified, *, tenant: str,
                     scope: str, until: datetime) -> None:
    """Park `tenant`'s `scope` until `until` and give this attempt back (`PARK_SCOPE`)."""
    await conn.execute(PARK_SCOPE, op_key, classified.category.value, classified.reason[:200],
                       tenant, f"parked.{scope}",
                       {"until": until.isoformat(), "reason": classified.reason[:200]})


async def set_status(conn: Conn, op_key: str, status: str) -> None:
    await conn.execute(SET_STATUS, op_key, status)


async def extend_attempt_budget(conn: Conn, op_key: str, budget: int) -> None:
    """A reviewer's `retry` grants a fresh, bounded budget of attempts on the same key."""
    await conn.execute(EXTEND_ATTEMPT_BUDGET, op_key, budget)


async def get(conn: Conn, op_key: str) -> asyncpg.Record | None:
    return await conn.fetchrow(GET_OPERATION, op_key)
