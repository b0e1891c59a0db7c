"""Reviewers and their tenants (`inboxcrm/schemas/sql/010_reviewers.sql`): the statements behind
`inboxcrm reviewer add|list|revoke`, the desk's token and session lookups, and the review
queue limited to a reviewer's tenants. Tokens are never stored, only their SHA-256."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from inboxcrm.store.items import record_dict

if TYPE_CHECKING:
    from collections.abc import Sequence

    from inboxcrm.store.db import Conn

ADD_REVIEWER = """
INSERT INTO reviewers (name, token_sha256, tenants, created_by, role)
VALUES ($1, $2, $3, $4, $5)
RETURNING reviewer_id, name, tenants, created_at, role
"""

# The name is claimed for good: a second claim (the name of a revoked reviewer) conflicts.
CLAIM_NAME = "INSERT INTO reviewer_names (name, reviewer_id) VALUES ($1, $2)"

LIST_REVIEWERS = """
SELECT reviewer_id, name, tenants, role, created_at, created_by, revoked_at, revoked_by
FROM reviewers ORDER BY name, reviewer_id
"""

REVOKE_REVIEWER = """
UPDATE reviewers SET revoked_at = now(), revoked_by = $2
WHERE name = $1 AND revoked_at IS NULL
RETURNING reviewer_id, name, tenants, role
"""

ACTIVE_BY_TOKEN = """
SELECT reviewer_id, name, tenants, role FROM reviewers
WHERE token_sha256 = $1 AND revoked_at IS NULL
"""

ACTIVE_BY_ID = """
SELECT reviewer_id, name, tenants, role FROM reviewers
WHERE reviewer_id = $1 AND revoked_at IS NULL
"""

# The role of the active reviewer with this name (what a decision's authority is checked on).
ACTIVE_ROLE = "SELECT role FROM reviewers WHERE name = $1 AND revoked_at IS NULL"

SET_ROLE = """
UPDATE reviewers SET role = $2 WHERE name = $1 AND revoked_at IS NULL
RETURNING reviewer_id, name, tenants, role
"""

RECORD_REVIEWER_CHANGE = """
INSERT INTO audit_log (tenant, actor, action, detail) VALUES (NULL, $1, $2, $3)
"""

# The owned review queue, oldest first, limited to a set of tenants ($1 NULL: every tenant).
REVIEW_QUEUE_FOR_TENANTS = """
SELECT r.workflow_id, r.tenant, r.reason, r.owner, r.first_seen, r.latest_attempt,
       r.wait_id, r.escalate_at, r.escalated_at, e.state
FROM review_tasks r JOIN inbound_events e ON e.event_id = r.event_id
WHERE r.status = 'open' AND ($1::text[] IS NULL OR r.tenant = ANY($1::text[]))
ORDER BY r.first_seen, r.task_id
"""

ITEM_TENANT = "SELECT tenant FROM inbound_events WHERE workflow_id = $1"


class NameTaken(Exception):
    """An active reviewer already has this name."""


class NameRetired(Exception):
    """A revoked reviewer had this name: it is never given to someone else."""


async def add_reviewer(conn: Conn, name: str, token_sha256: bytes, tenants: Sequence[str],
                       actor: str, role: str = "reviewer") -> dict[str, Any]:
    """One reviewer (and its audit entry) in one transaction."""
    async with conn.transaction():
        try:
            row = await conn.fetchrow(ADD_REVIEWER, name, token_sha256, list(tenants), actor,
                                      role)
        except asyncpg.UniqueViolationError as exc:
            raise NameTaken(name) from exc
        assert row is not None
        try:
            await conn.execute(CLAIM_NAME, name, row["reviewer_id"])
        except asyncpg.UniqueViolationError as exc:
            raise NameRetired(name) from exc
        await conn.execute(RECORD_REVIEWER_CHANGE, actor, "reviewer_added",
                           {"reviewer": name, "tenants": list(tenants), "role": role})
    return record_dict(row)


async def rotate_token(conn: Conn, *, name: str, token_sha256: bytes,
                       actor: str) -> dict[str, Any] | None:
    """A new token for the active reviewer `name`, the same person under the same name: the
    old row is revoked (its token and desk sessions end) and a new one holds the new token
    and the same tenants. None when no active reviewer has the name."""
    async with conn.transaction():
        old = await conn.fetchrow(REVOKE_REVIEWER, name, actor)
        if old is None:
            return None
        row = await conn.fetchrow(ADD_REVIEWER, name, token_sha256, list(old["tenants"]),
                                  actor, old["role"])
        assert row is not None
        await conn.execute(RECORD_REVIEWER_CHANGE, actor, "reviewer_token_rotated",
                           {"reviewer": name})
    return record_dict(row)


async def list_reviewers(conn: Conn) -> list[dict[str, Any]]:
    return [record_dict(r) for r in await conn.fetch(LIST_REVIEWERS)]


async def revoke_reviewer(conn: Conn, name: str, actor: str) -> dict[str, Any] | None:
    async with conn.transaction():
        row = await conn.fetchrow(REVOKE_REVIEWER, name, actor)
        if row is None:
            return None
        await conn.execute(RECORD_REVIEWER_CHANGE, actor, "reviewer_revoked",
                           {"reviewer": name})
    return record_dict(row)


async def set_role(conn: Conn, *, name: str, role: str, actor: str) -> dict[str, Any] | None:
    """Give the active reviewer `name` another role (audited); None when there is none."""
    async with conn.transaction():
        row = await conn.fetchrow(SET_ROLE, name, role)
        if row is None:
            return None
        await conn.execute(RECORD_REVIEWER_CHANGE, actor, "reviewer_role_set",
                           {"reviewer": name, "role": role})
    return record_dict(row)


async def active_role(conn: Conn, *, name: str) -> str | None:
    """The role of the active reviewer named `name` (None: no such reviewer, or revoked)."""
    value = await conn.fetchval(ACTIVE_ROLE, name)
    return None if value is None else str(value)


async def active_by_token(conn: Conn, token_sha256: bytes) -> asyncpg.Record | None:
    return await conn.fetchrow(ACTIVE_BY_TOKEN, token_sha256)


async def active_by_id(conn: Conn, reviewer_id: int) -> asyncpg.Record | None:
    return await conn.fetchrow(ACTIVE_BY_ID, reviewer_id)


async def item_tenant(conn: Conn, workflow_id: str) -> str | None:
    value = await conn.fetchval(ITEM_TENANT, workflow_id)
    return None if value is None else str(value)


async def review_queue(conn: Conn, tenants: Sequence[str] | None) -> list[dict[str, Any]]:
    """Open reviews of these tenants (None: all), oldest first, with age and overdue."""
    now = datetime.now(UTC)
    items = []
    for row in await conn.fetch(REVIEW_QUEUE_FOR_TENANTS,
                                None if tenants is None else list(tenants)):
        item = record_dict(row)
        item["age_seconds"] = int((now - row["first_seen"]).total_seconds())
        item["overdue"] = row["escalate_at"] <= now
        items.append(item)
    return items
