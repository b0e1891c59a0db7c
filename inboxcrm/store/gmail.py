"""The Gmail API source (docs/mailboxes.md): its registrations and every message read from
a Gmail mailbox, stored under `(tenant, address, Gmail message ID)` in one transaction
with its inbound event (the ledger row every source writes) and the mailbox's historyId
(`mailbox_subscriptions.cursor`), so a worker killed at any point stored a message with
its cursor or neither; the next catch-up reads it again and the key answers "stored".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from inboxcrm.store import copies, events

if TYPE_CHECKING:
    import asyncpg

    from inboxcrm.store.db import Conn

SOURCE = "gmail"
KIND = "gmail"
FOLDER = "INBOX"  # the label watched: one watcher per mailbox

ADD_MAILBOX = """
INSERT INTO mailboxes (tenant, kind, address, folder, oauth_token_env, push_topic)
VALUES ($1, 'gmail', $2, $3, $4, $5)
ON CONFLICT DO NOTHING
RETURNING folder
"""

# Which watchers a push for this address wakes (one address may be several tenants').
WATCHERS_OF = """
SELECT tenant, folder FROM mailboxes WHERE kind = 'gmail' AND address = $1
ORDER BY tenant, folder
"""

SEEN = """
SELECT g.role, g.event_id, e.workflow_id, e.workflow_started_at IS NOT NULL AS started
FROM gmail_messages g LEFT JOIN inbound_events e ON e.event_id = g.event_id
WHERE g.tenant = $1 AND g.address = $2 AND g.gmail_id = $3
"""

KNOWN_IDS = """
SELECT gmail_id FROM gmail_messages WHERE tenant = $1 AND address = $2 AND gmail_id = ANY($3)
"""

INSERT_MESSAGE = """
INSERT INTO gmail_messages (tenant, address, gmail_id, role, event_id, message_id,
                            content_sha256, size_bytes, history_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (tenant, address, gmail_id) DO NOTHING
RETURNING gmail_id
"""

# Never backwards: a late zombie attempt cannot move the historyId below what is stored.
ADVANCE_CURSOR = """
INSERT INTO mailbox_subscriptions (tenant, kind, address, folder, cursor)
VALUES ($1, 'gmail', $2, $3, $4)
ON CONFLICT (tenant, kind, address, folder) DO UPDATE
SET cursor = CASE WHEN mailbox_subscriptions.cursor IS NULL
                    OR mailbox_subscriptions.cursor::numeric < EXCLUDED.cursor::numeric
                  THEN EXCLUDED.cursor ELSE mailbox_subscriptions.cursor END,
    updated_at = now()
"""

TOUCH_MAILBOX = """
UPDATE mailboxes SET last_stored_at = now(), updated_at = now()
WHERE tenant = $1 AND kind = 'gmail' AND address = $2 AND folder = $3
"""


@dataclass(frozen=True)
class StoredGmail:
    """What storing one message did. `role`: item | copy | too_large; `new`: this call
    stored it (False: stored before, a duplicate read)."""

    role: str
    new: bool
    event_id: str | None
    workflow_id: str | None
    started: bool
    # Stored first by a concurrent read (a unique key answered, not our snapshot):
    # `inboxcrm_unique_conflicts_total{kind="mailbox_message"}`.
    raced: bool = False


async def add_gmail_mailbox(conn: Conn, *, tenant: str, address: str, oauth_token_env: str,
                            push_topic: str) -> bool:
    """Register a Gmail mailbox (its INBOX); False when it is already registered."""
    row = await conn.fetchrow(ADD_MAILBOX, tenant, address, FOLDER, oauth_token_env,
                              push_topic)
    return row is not None


async def watchers_of(conn: Conn, *, address: str) -> list[asyncpg.Record]:
    return list(await conn.fetch(WATCHERS_OF, address))


async def known_ids(conn: Conn, *, tenant: str, address: str,
                    gmail_ids: list[str]) -> set[str]:
    """Which of these Gmail message IDs were stored before (the full sync's match)."""
    rows = await conn.fetch(KNOWN_IDS, tenant, address, gmail_ids)
    return {str(r["gmail_id"]) for r in rows}


async def advance_cursor(conn: Conn, *, tenant: str, address: str, folder: str,
                         history_id: int) -> None:
    await conn.execute(ADVANCE_CURSOR, tenant, address, folder, str(history_id))


async def store_gmail_message(conn: Conn, *, tenant: str, address: str, folder: str,
                              gmail_id: str, raw: bytes | None, size: int,
                              message_id: str | None, content_sha256: str | None,
                              workflow_id: str, history_id: int | None) -> StoredGmail:
    """Store one message read from the mailbox with the historyId it was found under, in
    one transaction: an item (its inbound event), a copy of the tenant's first item of the
    same message (store/copies.py, the key every source uses), or too large (`raw` None)."""
    async with conn.transaction():
        seen = await conn.fetchrow(SEEN, tenant, address, gmail_id)
        if seen is not None:
            return StoredGmail(seen["role"], False, _str(seen["event_id"]),
                               seen["workflow_id"], bool(seen["started"]))
        await copies.lock_message(conn, tenant=tenant,
                                  key=message_id or content_sha256 or workflow_id)
        role, event_id, first = "too_large", None, None
        if raw is not None and content_sha256 is not None:
            role = "item"
            if message_id is not None:
                first = await copies.copy_target(
                    conn, tenant=tenant, source=SOURCE, mailbox=address, delivery_id=gmail_id,
                    message_id=message_id, content_sha256=content_sha256)
                if first is not None:
                    role, event_id = "copy", str(first["event_id"])
        item_workflow: str | None = None
        if role == "item":
            assert raw is not None and content_sha256 is not None
            row = await events.insert_event(
                conn, tenant=tenant, source=SOURCE, mailbox=address, delivery_id=gmail_id,
                workflow_id=workflow_id, raw=raw, content_sha256=content_sha256,
                size_bytes=size, actor=f"mailbox:{SOURCE}", message_id=message_id)
            assert row is not None
            if not row["new"]:
                return StoredGmail("item", False, str(row["event_id"]), workflow_id,
                                   bool(row["started"]), raced=True)
            event_id, item_workflow = str(row["event_id"]), workflow_id
        inserted = await conn.fetchval(INSERT_MESSAGE, tenant, address, gmail_id, role,
                                       event_id, message_id, content_sha256, size, history_id)
        if history_id is not None:
            await conn.execute(ADVANCE_CURSOR, tenant, address, folder, str(history_id))
        if inserted is None:
            return StoredGmail(role, False, event_id, None, True, raced=True)
        if role == "item":
            await conn.execute(TOUCH_MAILBOX, tenant, address, folder)
        elif role == "copy" and first is not None:
            assert message_id is not None and content_sha256 is not None
            await copies.record_copy(
                conn, tenant=tenant, event_id=str(first["event_id"]),
                workflow_id=first["workflow_id"], source=SOURCE, mailbox=address,
                delivery_id=gmail_id, copy_workflow_id=workflow_id, message_id=message_id,
                content_sha256=content_sha256, actor=f"mailbox:{SOURCE}")
    return StoredGmail(role, True, event_id, item_workflow, False)


def _str(value: object) -> str | None:
    return None if value is None else str(value)
