"""The audit log: one append-only entry per decision, state change and side effect. The
entries hold references and decisions, never a message body."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

INSERT_AUDIT = """
INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7)
"""


async def append(
    conn: Conn,
    *,
    tenant: str | None,
    event_id: str | None,
    workflow_id: str | None,
    actor: str,
    action: str,
    detail: dict[str, Any] | None = None,
    contact_id: str | None = None,
) -> None:
    """One audit entry. `detail` holds references and decisions, never a message body."""
    await conn.execute(
        INSERT_AUDIT, tenant, event_id, workflow_id, contact_id, actor, action,
        json_safe(detail or {}),
    )


def json_safe(detail: dict[str, Any]) -> dict[str, Any]:
    """An audit detail as plain JSON values (dates, UUIDs and the like as strings)."""
    value: dict[str, Any] = json.loads(json.dumps(detail, default=str))
    return value


# A tenant's destinations as a policy states them (inboxcrm/worker.py audits each change): a
# new entry only when the configuration differs from the tenant's last one (its
# fingerprint), and none for a tenant that never had destinations of its own.
RECORD_DESTINATIONS = """
WITH last AS (
    SELECT detail->>'fingerprint' AS fingerprint FROM audit_log
    WHERE tenant = $1 AND action = 'destinations_changed' AND workflow_id IS NULL
    ORDER BY audit_id DESC LIMIT 1)
INSERT INTO audit_log (tenant, actor, action, detail)
SELECT $1, $2, 'destinations_changed', $3
WHERE ($3::jsonb)->>'fingerprint' IS DISTINCT FROM (SELECT fingerprint FROM last)
  AND (EXISTS (SELECT 1 FROM last) OR NOT $4::boolean)
RETURNING audit_id
"""


async def record_destinations(conn: Conn, *, tenant: str, actor: str, detail: dict[str, Any],
                              empty: bool) -> bool:
    """Audit a tenant's destinations if they changed since its last entry (`detail` holds
    the fingerprint, providers, hosts and where secrets are read from; never a value).
    True when an entry was written."""
    written = await conn.fetchval(RECORD_DESTINATIONS, tenant, actor, json_safe(detail), empty)
    return written is not None


ENTRY_IDS = "SELECT audit_id FROM audit_log WHERE workflow_id = $1 ORDER BY audit_id"


async def entry_ids(conn: Conn, *, workflow_id: str) -> list[int]:
    """The IDs of an item's audit entries, oldest first: where a rehearsal case's evidence
    is (`inboxcrm audit --workflow` prints them)."""
    return [row["audit_id"] for row in await conn.fetch(ENTRY_IDS, workflow_id)]
