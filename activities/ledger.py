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
from typing import TYPE_CHECKING

import asyncpg

from activities.errors import Classified

if TYPE_CHECKING:
    from activities.store import Conn

CLAIM_OPERATION = """
WITH previous AS (
    SELECT op_key, status, last_error_category
    FROM operations WHERE op_key = $1 FOR UPDATE
)
UPDATE operations AS o
SET status = 'in_progress', attempts = o.attempts + 1, last_transition = now()
FROM previous
WHERE o.op_key = previous.op_key
  AND previous.status NOT IN ('completed', 'cancelled')
  AND o.attempts < o.max_attempts
RETURNING previous.status AS previous_status,
          previous.last_error_category AS previous_category,
          o.attempts, o.max_attempts, o.external_ref, o.event_id, o.workflow_id
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

RECORD_FAILURE = """
UPDATE operations
SET status = $2, last_error_category = $3, last_error = $4, last_transition = now()
WHERE op_key = $1
"""

SET_STATUS = """
UPDATE operations SET status = $2, last_transition = now() WHERE op_key = $1
"""

EXTEND_ATTEMPT_BUDGET = """
UPDATE operations
SET max_attempts = attempts + $2, status = CASE WHEN status = 'completed' THEN status
                                            ELSE 'waiting' END,
    last_transition = now()
WHERE op_key = $1
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


class OperationNotFound(LookupError):
    pass


async def claim(conn: Conn, op_key: str) -> Claim:
    """Claim the operation for this attempt (one statement, row-locked)."""
    row = await conn.fetchrow(CLAIM_OPERATION, op_key)
    if row is not None:
        needs_reconcile = row["previous_status"] == "in_progress" or (
            row["previous_category"] == "unknown"
        )
        return Claim(op_key, False, None, needs_reconcile, row["attempts"], row["external_ref"])
    current = await conn.fetchrow(GET_OPERATION, op_key)
    if current is None:
        raise OperationNotFound(op_key)
    if current["status"] in ("completed", "cancelled"):
        return Claim(op_key, True, current["destination_id"], False, current["attempts"],
                     current["external_ref"])
    return Claim(op_key, False, None, False, current["attempts"], current["external_ref"],
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


async def set_status(conn: Conn, op_key: str, status: str) -> None:
    await conn.execute(SET_STATUS, op_key, status)


async def extend_attempt_budget(conn: Conn, op_key: str, budget: int) -> None:
    """A reviewer's `retry` grants a fresh, bounded budget of attempts on the same key."""
    await conn.execute(EXTEND_ATTEMPT_BUDGET, op_key, budget)


async def get(conn: Conn, op_key: str) -> asyncpg.Record | None:
    return await conn.fetchrow(GET_OPERATION, op_key)
