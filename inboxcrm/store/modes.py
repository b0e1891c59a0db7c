"""A tenant's mode (docs/architecture.md §6, "Going live"): the `settings` row `mode` holds
`{"mode": "shadow"|"live", "since", "by"}`; without a row the tenant runs in the mode its
policy starts in. The per-item path never calls these: extraction and planning read the row
inside the statements they already run (`inboxcrm/activities/extract.py`,
`inboxcrm/activities/match.py`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

MODE_KEY = "mode"

CURRENT_MODE = """
SELECT value ->> 'mode' AS mode, (value ->> 'since')::timestamptz AS since,
       value ->> 'by' AS by, now() AS now
FROM settings WHERE tenant = $1 AND key = 'mode'
"""

# The switch and its audit entry, in one statement. Nothing changes (no row switched) when
# the tenant is in that mode already, so repeating `inboxcrm mode T live` never restarts a
# ramp. $1 tenant, $2 the new mode, $3 the operator, $4 the mode the tenant's policy starts
# in (no row yet), $5 the policy's ramp (JSON or null) for the audit entry.
SWITCH_MODE = """
WITH previous AS (
    SELECT COALESCE((SELECT value ->> 'mode' FROM settings
                     WHERE tenant = $1 AND key = 'mode' FOR UPDATE), $4::text) AS mode
), switched AS (
    INSERT INTO settings (tenant, key, value, updated_by)
    SELECT $1, 'mode', jsonb_build_object('mode', $2::text, 'since', now(), 'by', $3::text), $3
    FROM previous WHERE previous.mode <> $2::text
    ON CONFLICT (tenant, key) DO UPDATE
    SET value = EXCLUDED.value, updated_by = EXCLUDED.updated_by, updated_at = now()
    RETURNING value
), audited AS (
    INSERT INTO audit_log (tenant, actor, action, detail)
    SELECT $1, $3, 'mode_changed', jsonb_build_object(
        'tenant', $1::text, 'from', previous.mode, 'to', $2::text, 'ramp', $5::jsonb)
    FROM previous, switched
)
SELECT previous.mode AS previous, (SELECT value FROM switched) AS value FROM previous
"""


async def current_mode(conn: Conn, tenant: str) -> asyncpg.Record | None:
    """The `mode` row of a tenant (None: it runs in its policy's mode)."""
    return await conn.fetchrow(CURRENT_MODE, tenant)


async def switch_mode(conn: Conn, tenant: str, mode: str, actor: str, policy_mode: str,
                      ramp: dict[str, Any] | None) -> tuple[str, bool]:
    """Switch the tenant's mode; returns (the mode before, whether it changed)."""
    row = await conn.fetchrow(SWITCH_MODE, tenant, mode, actor, policy_mode,
                              json.dumps(ramp) if ramp is not None else None)
    assert row is not None  # a SELECT over a one-row CTE
    return str(row["previous"]), row["value"] is not None
