"""Runs that ended without settling their item (failed, terminated, timed out, cancelled in
Temporal): the item is written `failed` with the reason and put in the owned review queue,
where `inboxcrm replay` picks it up (docs/architecture.md §3). Found by the relay's sweeper
(`inboxcrm/ingress/failed_runs.py`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncpg

    from inboxcrm.store.db import Conn

# The reasons of a `failed` item: how its run ended.
REASONS = ("run_failed", "run_terminated", "run_timed_out", "run_cancelled")

# Of these workflow IDs, the items whose state is not settled. $1 workflow IDs,
# $2 the settled states.
UNSETTLED = """
SELECT workflow_id, tenant FROM inbound_events
WHERE workflow_id = ANY($1::text[]) AND state <> ALL($2::text[])
"""

# The item of a run that closed at $4 becomes `failed` with reason $2 and an open review task
# (a task already open, the wait the run was in, takes the new reason: its decisions died with
# the run), with the audit entry; in one statement. Nothing happens if the item has settled
# meanwhile, or if a replay was recorded after the run closed (the new run owns the item).
# $1 workflow_id, $2 reason, $3 the settled states, $4 close time, $5 review owner,
# $6 escalation seconds, $7 audit detail.
MARK_FAILED = """
WITH failed AS (
    UPDATE inbound_events SET state = 'failed', reason = $2, updated_at = now()
    WHERE workflow_id = $1 AND state <> ALL($3::text[])
      AND NOT EXISTS (SELECT 1 FROM audit_log
                      WHERE workflow_id = $1 AND action = 'replayed' AND at > $4)
    RETURNING event_id, tenant, workflow_id
), task AS (
    INSERT INTO review_tasks (event_id, workflow_id, tenant, reason, owner, escalate_at,
                              wait_id, allowed, needs_sender)
    SELECT event_id, workflow_id, tenant, $2, $5, now() + make_interval(secs => $6), NULL,
           '[]'::jsonb, false
    FROM failed
    ON CONFLICT (workflow_id) WHERE status = 'open'
    DO UPDATE SET reason = EXCLUDED.reason, latest_attempt = now(), wait_id = NULL,
                  allowed = '[]'::jsonb, needs_sender = false
), audited AS (
    INSERT INTO audit_log (tenant, event_id, workflow_id, actor, action, detail)
    SELECT tenant, event_id, workflow_id, 'sweeper', 'state_changed', $7 FROM failed
)
SELECT count(*) FROM failed
"""


async def unsettled(conn: Conn, workflow_ids: Iterable[str], settled: Iterable[str]
                    ) -> list[asyncpg.Record]:
    return list(await conn.fetch(UNSETTLED, list(workflow_ids), list(settled)))


async def mark_failed(conn: Conn, workflow_id: str, *, reason: str, settled: Iterable[str],
                      closed_at: datetime, owner: str, escalation_seconds: float,
                      detail: dict[str, Any]) -> bool:
    """True when the item was written `failed` now."""
    return bool(await conn.fetchval(MARK_FAILED, workflow_id, reason, list(settled), closed_at,
                                    owner, escalation_seconds, detail))
