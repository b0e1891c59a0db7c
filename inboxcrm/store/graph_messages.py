"""Messages read from a mailbox over Microsoft Graph (docs/mailboxes.md): each is stored
under its immutable ID, the delivery key `(tenant, 'graph', address, immutable id)` of the
ledger every source writes (`inbound_events`), or, when the tenant already has an item of
the same Message-ID and content hash, as a copy of it (`inbound_copies`, store/copies.py).
A notification repeated, a delta round that sees a message a notification brought, a
worker killed between the two: the keys answer "already stored" and nothing starts twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inboxcrm.store import copies, events
from inboxcrm.store.mailboxes import StoredMessage

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

SOURCE = "graph"

TOUCH_MAILBOX = """
UPDATE mailboxes SET last_stored_at = now(), updated_at = now()
WHERE tenant = $1 AND kind = 'graph' AND address = $2 AND folder = $3
"""


async def store_graph_message(conn: Conn, *, tenant: str, address: str, folder: str,
                              immutable_id: str, raw: bytes, message_id: str | None,
                              content_sha256: str, workflow_id: str) -> StoredMessage:
    """Store one message fetched by immutable ID: an item (its inbound event, with its
    `received` audit entry) or a copy of the tenant's first item of it; `new` False when
    this delivery key was stored before (a duplicate read)."""
    async with conn.transaction():
        seen = await events.find_event(conn, tenant=tenant, source=SOURCE, mailbox=address,
                                       delivery_id=immutable_id)
        if seen is not None:
            return StoredMessage("item", False, str(seen["event_id"]), seen["workflow_id"],
                                 bool(seen["started"]))
        # Item or copy, decided under the lock every source takes for this message of this
        # tenant: a webhook delivery or an IMAP watcher's read of it waits here too.
        await copies.lock_message(conn, tenant=tenant, key=message_id or content_sha256)
        if message_id is not None:
            first = await copies.copy_target(
                conn, tenant=tenant, source=SOURCE, mailbox=address, delivery_id=immutable_id,
                message_id=message_id, content_sha256=content_sha256)
            if first is not None:
                recorded = await copies.record_copy(
                    conn, tenant=tenant, event_id=str(first["event_id"]),
                    workflow_id=first["workflow_id"], source=SOURCE, mailbox=address,
                    delivery_id=immutable_id, copy_workflow_id=workflow_id,
                    message_id=message_id, content_sha256=content_sha256,
                    actor=f"mailbox:{SOURCE}")
                return StoredMessage("copy", recorded, str(first["event_id"]), None, True)
        row = await events.insert_event(
            conn, tenant=tenant, source=SOURCE, mailbox=address, delivery_id=immutable_id,
            workflow_id=workflow_id, raw=raw, content_sha256=content_sha256,
            size_bytes=len(raw), actor=f"mailbox:{SOURCE}", message_id=message_id)
        assert row is not None
        if not row["new"]:
            return StoredMessage("item", False, str(row["event_id"]), workflow_id,
                                 bool(row["started"]), raced=True)
        await conn.execute(TOUCH_MAILBOX, tenant, address, folder)
    return StoredMessage("item", True, str(row["event_id"]), workflow_id, False)


SEEN = """
SELECT 'item' AS role, event_id, workflow_id, workflow_started_at IS NOT NULL AS started
FROM inbound_events WHERE tenant = $1 AND source = 'graph' AND mailbox = $2 AND delivery_id = $3
UNION ALL
SELECT 'copy', event_id, NULL, true
FROM inbound_copies WHERE tenant = $1 AND source = 'graph' AND mailbox = $2 AND delivery_id = $3
LIMIT 1
"""


async def seen(conn: Conn, *, tenant: str, address: str,
               immutable_id: str) -> StoredMessage | None:
    """What was stored under this immutable ID before (None: nothing), so a message is not
    downloaded again."""
    row = await conn.fetchrow(SEEN, tenant, address, immutable_id)
    if row is None:
        return None
    return StoredMessage(row["role"], False, str(row["event_id"]), row["workflow_id"],
                         bool(row["started"]))
