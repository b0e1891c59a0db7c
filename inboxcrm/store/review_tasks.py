"""The `review_tasks` table: the owned review queue. The workflow's state mirror opens a
task when an item waits for a person and closes it when the item moves on
(inboxcrm/activities/bookkeeping.py)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncpg

    from inboxcrm.store.db import Conn

# A new wait (another wait ID) on a task still open gets its own escalation time; the same
# wait re-entered (a hold) keeps it. $1 event_id, $2 workflow_id, $3 tenant, $4 reason,
# $5 owner, $6 destination ref, $7 escalation seconds, $8 wait ID, $9 allowed decisions,
# $10 needs sender, $11 the escalation time the workflow fixed when the wait opened
# (NULL: now + $7 seconds).
OPEN_REVIEW_TASK = """
INSERT INTO review_tasks (event_id, workflow_id, tenant, reason, owner, destination_ref,
                          escalate_at, wait_id, allowed, needs_sender)
VALUES ($1, $2, $3, $4, $5, $6, COALESCE($11::timestamptz, now() + make_interval(secs => $7)),
        $8, $9, $10)
ON CONFLICT (workflow_id) WHERE status = 'open'
DO UPDATE SET reason = EXCLUDED.reason, latest_attempt = now(),
              destination_ref = COALESCE(EXCLUDED.destination_ref, review_tasks.destination_ref),
              wait_id = EXCLUDED.wait_id, allowed = EXCLUDED.allowed,
              needs_sender = EXCLUDED.needs_sender,
              escalate_at = CASE WHEN review_tasks.wait_id IS DISTINCT FROM EXCLUDED.wait_id
                                 THEN EXCLUDED.escalate_at ELSE review_tasks.escalate_at END,
              escalated_at = CASE WHEN review_tasks.wait_id IS DISTINCT FROM EXCLUDED.wait_id
                                  THEN NULL ELSE review_tasks.escalated_at END
"""

CLOSE_REVIEW_TASKS = """
UPDATE review_tasks SET status = 'resolved', resolved_at = now(), resolution = $2
WHERE workflow_id = $1 AND status = 'open'
"""

def settle_parts(*, event_id: str, workflow_id: str, tenant: str, state: str, reason: str,
                 detail: str, guard: str | None = None, once: bool = False
                 ) -> tuple[str, str, str]:
    """What settling an item in a state (neither a review nor `rejected`) writes: the state,
    the closing of any open review task, and the `state_changed` audit entry, as three
    statements to run as one. The arguments are SQL expressions (parameter references);
    `guard`, a condition each one also needs (the ledger's: "the operation completed");
    `once`: the audit entry only if the item has none for this state yet (an end)."""
    also = f" AND {guard}" if guard else ""
    audit_if = [guard] if guard else []
    if once:
        audit_if.append(
            f"NOT EXISTS (SELECT 1 FROM audit_log AS a WHERE a.workflow_id = {workflow_id} "
            f"AND a.action = 'state_changed' AND a.detail ->> 'state' = {state})")
    return (
        f"UPDATE inbound_events SET state = {state}, reason = {reason}, updated_at = now() "
        f"WHERE event_id = {event_id}{also}",
        f"UPDATE review_tasks SET status = 'resolved', resolved_at = now(), "
        f"resolution = {state} WHERE workflow_id = {workflow_id} AND status = 'open'{also}",
        f"INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, "
        f"detail) SELECT {tenant}, {event_id}, {workflow_id}, NULL, 'workflow', "
        f"'state_changed', {detail}"
        + (f" WHERE {' AND '.join(audit_if)}" if audit_if else ""),
    )


def _settle(once: bool) -> str:
    state, closed, audit = settle_parts(event_id="$1", state="$2", reason="$3",
                                        workflow_id="$4", tenant="$5", detail="$6", once=once)
    return f"WITH state AS ({state}), closed AS ({closed})\n{audit}\n"


# The common case in one round trip, atomically: $1 event_id, $2 state, $3 reason,
# $4 workflow_id, $5 tenant, $6 audit detail.
SETTLE_STATE = _settle(once=False)
# The same for an end (a terminal state), whose audit entry is written once: a run that
# records the end again (the next worker re-running an item whose last step had already
# recorded it when its worker died) restores the state but does not tell the story twice.
SETTLE_END = _settle(once=True)

RECORD_RESOLVER = """
UPDATE review_tasks SET resolved_by = $2 WHERE workflow_id = $1 AND status = 'open'
"""

MARK_ESCALATED = """
UPDATE review_tasks SET escalated_at = now() WHERE workflow_id = $1 AND status = 'open'
"""


async def settle(conn: Conn | asyncpg.Pool, *, event_id: str, state: str, reason: str | None,
                 workflow_id: str, tenant: str, detail: dict[str, Any], end: bool) -> None:
    """SETTLE_STATE, or SETTLE_END for an end (`end`): one round trip."""
    await conn.execute(SETTLE_END if end else SETTLE_STATE, event_id, state, reason,
                       workflow_id, tenant, detail)


async def open_review_task(
    conn: Conn, *, event_id: str, workflow_id: str, tenant: str, reason: str, owner: str,
    destination_ref: str | None, escalation_seconds: float, wait_id: str | None,
    allowed: list[str], needs_sender: bool, escalate_at: datetime | None,
) -> None:
    await conn.execute(OPEN_REVIEW_TASK, event_id, workflow_id, tenant, reason, owner,
                       destination_ref, escalation_seconds, wait_id, allowed, needs_sender,
                       escalate_at)


async def close_review_tasks(conn: Conn, *, workflow_id: str, resolution: str) -> None:
    await conn.execute(CLOSE_REVIEW_TASKS, workflow_id, resolution)


async def record_resolver(conn: Conn, *, workflow_id: str, resolved_by: str) -> None:
    await conn.execute(RECORD_RESOLVER, workflow_id, resolved_by)


async def mark_escalated(conn: Conn | asyncpg.Pool, *, workflow_id: str) -> None:
    await conn.execute(MARK_ESCALATED, workflow_id)


LATEST_TASK = """
SELECT reason, owner, status, first_seen, escalate_at, escalated_at, resolved_at, resolved_by,
       resolution
FROM review_tasks WHERE workflow_id = $1 ORDER BY task_id DESC LIMIT 1
"""


async def latest_task(conn: Conn | asyncpg.Pool, *, workflow_id: str) -> asyncpg.Record | None:
    """The item's latest review task, open or resolved (the rehearsal prints it)."""
    row: asyncpg.Record | None = await conn.fetchrow(LATEST_TASK, workflow_id)
    return row
