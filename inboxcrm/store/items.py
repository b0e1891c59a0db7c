"""What operators and reviewers ask of the store: an item's status, the owned review queue,
pause switches, the audit story. Used by the CLI (and the rehearsal)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from inboxcrm.store import copies, events, failed_runs

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

ITEM_STATUS = """
SELECT e.event_id, e.workflow_id, e.tenant, e.source, e.mailbox, e.delivery_id, e.state,
       e.reason, e.route, e.route_reasons, e.received_at, e.workflow_started_at, e.contact_id,
       c.crm_record_id
FROM inbound_events e LEFT JOIN contacts c ON c.contact_id = e.contact_id
WHERE e.workflow_id = $1
"""

ITEM_OPERATIONS = """
SELECT op_key, action, status, attempts, max_attempts, last_error_category, last_error,
       external_ref, destination_id, first_seen, first_attempt_at, key_window_from,
       last_transition, last_request_id
FROM operations WHERE workflow_id = $1 ORDER BY first_seen
"""

ITEM_REVIEW = """
SELECT reason, owner, status, first_seen, latest_attempt, destination_ref, escalate_at,
       escalated_at, resolved_by
FROM review_tasks WHERE workflow_id = $1 ORDER BY task_id DESC LIMIT 1
"""

REVIEW_QUEUE = """
SELECT r.workflow_id, r.tenant, r.reason, r.owner, r.first_seen, r.latest_attempt,
       r.destination_ref, r.escalate_at, r.escalated_at, e.state
FROM review_tasks r JOIN inbound_events e ON e.event_id = r.event_id
WHERE r.status = 'open' AND ($1::text IS NULL OR r.tenant = $1)
ORDER BY r.first_seen
"""

SET_SWITCH = """
INSERT INTO settings (tenant, key, value, updated_by) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant, key) DO UPDATE
SET value = EXCLUDED.value, updated_by = EXCLUDED.updated_by, updated_at = now()
"""

# `inboxcrm resume` also lifts a destination's park of the same scope (`parked.crm`,
# `parked.send`; an operator knows the limit is over): if it is not, the next call meets it
# again and parks again, spending no attempt. $1 tenant (NULL: every tenant), $2 park keys.
LIFT_PARKS = """
DELETE FROM settings WHERE ($1::text IS NULL OR tenant = $1) AND key = ANY($2::text[])
"""

AUDIT_BY_WORKFLOW = """
SELECT at, actor, action, detail, workflow_id FROM audit_log
WHERE workflow_id = $1 ORDER BY audit_id
"""

# A person is an address canonicalised under each tenant's own rules: ($1[i], $2[i]) is one
# tenant and the identity key there; entries of other tenants never match.
AUDIT_BY_IDENTITY = """
WITH person AS (SELECT * FROM unnest($1::text[], $2::text[]) AS p(tenant, canonical))
SELECT a.at, a.actor, a.action, a.detail, a.workflow_id, a.tenant FROM audit_log a
WHERE (a.tenant, a.workflow_id) IN (SELECT e.tenant, e.workflow_id FROM inbound_events e
                                    JOIN person p ON (e.tenant, e.canonical_email)
                                                   = (p.tenant, p.canonical))
   OR (a.tenant, a.contact_id) IN (SELECT c.tenant, c.contact_id FROM contacts c
                                   JOIN person p ON (c.tenant, c.canonical_email)
                                                  = (p.tenant, p.canonical))
ORDER BY a.audit_id
"""

# A failed run started again under its workflow ID (`inboxcrm replay`), with who and why; the
# review task of the `failed` item (`inboxcrm/store/failed_runs.py`) is answered by it. A task
# the new run already opened for a wait of its own has another reason and stays open.
RECORD_REPLAYED = """
WITH answered AS (
    UPDATE review_tasks SET status = 'resolved', resolved_at = now(), resolution = 'replayed',
                            resolved_by = $4
    WHERE workflow_id = $3 AND status = 'open' AND reason = ANY($6::text[])
)
INSERT INTO audit_log (tenant, event_id, workflow_id, actor, action, detail)
VALUES ($1, $2, $3, $4, 'replayed', $5)
"""

# `inboxcrm recover` (docs/architecture.md §6, bounded batch recovery): one tenant's items
# waiting for a person in one of the states $2 (`blocked`, `ambiguous`), whose reason is $3
# or starts with `$3:` (`http_401` names `http_401:INVALID_AUTHENTICATION`), blocked (the
# open task first seen) at or after $4; oldest first, at most $5. The step a retry would
# repeat is the item's operation the failure stopped (blocked, ambiguous, or waiting with
# its attempts spent), else its latest one not completed or cancelled; with its key.
RECOVERY_CANDIDATES = """
SELECT e.workflow_id, e.tenant, e.state, e.reason, t.first_seen AS blocked_at, t.wait_id,
       t.allowed, o.op_key, o.action, o.status AS op_status, o.attempts, o.max_attempts
FROM inbound_events e
JOIN review_tasks t ON t.workflow_id = e.workflow_id AND t.status = 'open'
LEFT JOIN LATERAL (
    SELECT op_key, action, status, attempts, max_attempts FROM operations p
    WHERE p.workflow_id = e.workflow_id AND p.status NOT IN ('completed', 'cancelled')
    ORDER BY p.status IN ('blocked', 'ambiguous', 'waiting') DESC, p.last_transition DESC
    LIMIT 1
) o ON true
WHERE e.tenant = $1 AND e.state = ANY($2::text[])
  AND (e.reason = $3 OR split_part(e.reason, ':', 1) = $3)
  AND t.first_seen >= $4
ORDER BY t.first_seen, e.workflow_id
LIMIT $5
"""

# The operation keys of a set of items, to show a recovery kept them.
OPERATION_KEYS = """
SELECT workflow_id, op_key, action, status FROM operations
WHERE workflow_id = ANY($1::text[]) ORDER BY workflow_id, first_seen
"""

SCOPES = ("crm", "send", "all")


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def record_dict(record: asyncpg.Record) -> dict[str, Any]:
    return {key: _jsonable(record[key]) for key in record.keys()}  # noqa: SIM118


async def item_status(conn: asyncpg.Connection[Any], workflow_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(ITEM_STATUS, workflow_id)
    copy_of = None
    if row is None:
        # A copy's own workflow ID (never started): the item it is a copy of.
        copy_of = await copies.item_of_copy(conn, workflow_id=workflow_id)
        if copy_of is None:
            return None
        row = await conn.fetchrow(ITEM_STATUS, copy_of["workflow_id"])
        if row is None:
            return None
    status = record_dict(row)
    if copy_of is not None:
        status["copy"] = {"workflow_id": copy_of["copy_workflow_id"],
                          "source": copy_of["source"], "mailbox": copy_of["mailbox"],
                          "delivery_id": copy_of["delivery_id"],
                          "received_at": copy_of["received_at"].isoformat()}
    status["operations"] = [record_dict(r) for r in await conn.fetch(ITEM_OPERATIONS, workflow_id)]
    review = await conn.fetchrow(ITEM_REVIEW, workflow_id)
    status["review"] = record_dict(review) if review else None
    # Further deliveries of the same message (other mailboxes, folders or sources): one item.
    found = await copies.copies_of_event(conn, event_id=str(row["event_id"]))
    status["copies"] = {"count": len(found),
                        "sources": sorted({c["source"] for c in found}),
                        "deliveries": found}
    return status


async def review_queue(conn: asyncpg.Connection[Any], tenant: str | None = None
                       ) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    items = []
    for row in await conn.fetch(REVIEW_QUEUE, tenant):
        item = record_dict(row)
        item["age_seconds"] = int((now - row["first_seen"]).total_seconds())
        item["overdue"] = row["escalate_at"] <= now
        items.append(item)
    return items


async def set_pause(conn: Conn, tenant: str | None, scope: str, paused: bool,
                    actor: str) -> None:
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
    await conn.execute(SET_SWITCH, tenant or "*", f"paused.{scope}", json.loads(
        "true" if paused else "false"), actor)
    detail: dict[str, Any] = {"scope": scope, "tenant": tenant or "*"}
    if not paused:
        keys = [f"parked.{name}" for name in (("crm", "send") if scope == "all" else (scope,))]
        lifted = await conn.execute(LIFT_PARKS, tenant, keys)
        detail["destination_parks_lifted"] = int(lifted.split()[-1])
    await conn.execute(
        "INSERT INTO audit_log (tenant, actor, action, detail) VALUES ($1, $2, $3, $4)",
        tenant, actor, "paused" if paused else "resumed", detail,
    )


async def audit_story(conn: asyncpg.Connection[Any], *, workflow_id: str | None = None,
                      identities: list[tuple[str, str]] | None = None
                      ) -> list[dict[str, Any]]:
    """One event's entries, or a person's: `identities` pairs each tenant searched with the
    address's canonical form under that tenant's policy."""
    if workflow_id is not None:
        rows = await conn.fetch(AUDIT_BY_WORKFLOW, workflow_id)
    else:
        pairs = identities or []
        rows = await conn.fetch(AUDIT_BY_IDENTITY, [t for t, _ in pairs], [c for _, c in pairs])
    return [record_dict(r) for r in rows]


async def event_of_workflow(conn: asyncpg.Connection[Any],
                            workflow_id: str) -> asyncpg.Record | None:
    """The item's event ID and tenant (`events.EVENT_OF_WORKFLOW`), or None."""
    return await conn.fetchrow(events.EVENT_OF_WORKFLOW, workflow_id)


async def record_replayed(conn: asyncpg.Connection[Any], *, tenant: str, event_id: Any,
                          workflow_id: str, actor: str, reason: str,
                          label: str | None = None) -> None:
    """`actor`: the authenticated decider; `label`: the name they typed (display only)."""
    await conn.execute(RECORD_REPLAYED, tenant, event_id, workflow_id, actor,
                       {"reason": reason, "typed_reviewer": label},
                       list(failed_runs.REASONS))


async def recovery_candidates(conn: asyncpg.Connection[Any], *, tenant: str,
                              states: list[str], reason: str, since: datetime,
                              limit: int) -> list[dict[str, Any]]:
    """The items `inboxcrm recover` may retry (RECOVERY_CANDIDATES), as plain dicts."""
    rows = await conn.fetch(RECOVERY_CANDIDATES, tenant, states, reason, since, limit)
    return [record_dict(r) for r in rows]


async def operation_keys(conn: asyncpg.Connection[Any], *,
                         workflow_ids: list[str]) -> list[dict[str, Any]]:
    return [record_dict(r) for r in await conn.fetch(OPERATION_KEYS, workflow_ids)]
