"""The words of each follow-up as planned (`template_versions`, docs/architecture.md §5), and
the inbound message's head the send reads its language from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# Written in the planner's transaction; a version is written once per tenant.
SAVE_TEMPLATE_VERSION = """
INSERT INTO template_versions (tenant, template_ref, sources) VALUES ($1, $2, $3)
ON CONFLICT (tenant, template_ref) DO NOTHING
"""

TEMPLATE_VERSION = """
SELECT sources FROM template_versions WHERE tenant = $1 AND template_ref = $2
"""

# The headers of the stored message (its first 64 KiB; NULL once purged).
MESSAGE_HEAD = """
SELECT substring(raw FROM 1 FOR 65536) AS head FROM inbound_events WHERE event_id = $1::uuid
"""


async def save_version(conn: Conn, tenant: str, template_ref: str,
                       sources: dict[str, Any]) -> None:
    await conn.execute(SAVE_TEMPLATE_VERSION, tenant, template_ref, sources)


async def stored_version(conn: Conn, tenant: str, template_ref: str) -> dict[str, Any] | None:
    sources = await conn.fetchval(TEMPLATE_VERSION, tenant, template_ref)
    return dict(sources) if sources is not None else None


async def message_head(conn: Conn, event_id: str) -> bytes | None:
    head = await conn.fetchval(MESSAGE_HEAD, event_id)
    return bytes(head) if head is not None else None
