"""Small named queries shared by several activities: item state and audit entries. Each is
one parameterised statement. (The pause switches are read by `ledger.BEGIN_ATTEMPT`.)"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import asyncpg

SET_EVENT_STATE = """
UPDATE inbound_events SET state = $2, reason = $3, updated_at = now() WHERE event_id = $1
"""

INSERT_AUDIT = """
INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7)
"""

if TYPE_CHECKING:
    Conn = asyncpg.Connection[Any] | asyncpg.pool.PoolConnectionProxy[Any]


async def set_event_state(conn: Conn, event_id: str, state: str, reason: str | None) -> None:
    await conn.execute(SET_EVENT_STATE, event_id, state, reason)


async def audit(
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
