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
