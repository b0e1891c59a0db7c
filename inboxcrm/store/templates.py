"""The words of each follow-up as planned (`template_versions`, docs/architecture.md §5): written
in the planner's transaction with the intent (`intents.PLAN_FOLLOWUP`), read by the send."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

TEMPLATE_VERSION = """
SELECT sources FROM template_versions WHERE tenant = $1 AND template_ref = $2
"""


async def stored_version(conn: Conn, tenant: str, template_ref: str) -> dict[str, Any] | None:
    sources = await conn.fetchval(TEMPLATE_VERSION, tenant, template_ref)
    return dict(sources) if sources is not None else None
