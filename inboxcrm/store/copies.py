"""Copies (`inbound_copies`, migration 060): the same message (tenant, Message-ID, content
hash) delivered again by another mailbox, folder or source is one item. The first delivery
is the inbound event; each further one is recorded here, linked to it, with a
`copy_recorded` audit entry, and starts nothing (docs/architecture.md §2).

Every source decides item or copy under the same transaction-scoped lock on (tenant,
Message-ID), so two deliveries of one message arriving at once, by a webhook and a mailbox
watcher, make one item and one copy; the unique index on the events is the last word.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncpg

    from inboxcrm.store.db import Conn

# For this transaction only; the key every source uses (the IMAP watcher included).
LOCK_MESSAGE = "SELECT pg_advisory_xact_lock(hashtext($1 || '/' || $2))"

# The item a delivery is a copy of: the one its delivery key was recorded against before
# (`recorded`), else the tenant's first item of the same Message-ID and content hash. None
# when the delivery key is an item's own (a redelivery) or the message is new.
# $1 tenant, $2 source, $3 mailbox, $4 delivery_id, $5 message_id, $6 content_sha256.
COPY_TARGET = """
WITH recorded AS (
    SELECT c.event_id FROM inbound_copies c
    WHERE c.tenant = $1 AND c.source = $2 AND c.mailbox = $3 AND c.delivery_id = $4
), first AS (
    SELECT e.event_id FROM inbound_events e
    WHERE e.tenant = $1 AND e.message_id = $5 AND e.content_sha256 = $6
      AND NOT EXISTS (SELECT 1 FROM recorded)
)
SELECT e.event_id, e.workflow_id, e.state, e.workflow_started_at IS NOT NULL AS started,
       EXISTS (SELECT 1 FROM recorded) AS recorded
FROM inbound_events e
WHERE e.event_id IN (SELECT event_id FROM recorded UNION ALL SELECT event_id FROM first)
  AND NOT EXISTS (SELECT 1 FROM inbound_events own
                  WHERE own.tenant = $1 AND own.source = $2 AND own.mailbox = $3
                    AND own.delivery_id = $4)
ORDER BY e.received_at LIMIT 1
"""

# The copy row and its audit entry, in one statement; a second call for the same delivery
# key records nothing. $1 tenant, $2 event_id, $3 source, $4 mailbox, $5 delivery_id,
# $6 message_id, $7 content_sha256, $8 the audit actor, $9 the first item's workflow ID,
# $10 the copy's own (never started) workflow ID.
RECORD_COPY = """
WITH inserted AS (
    INSERT INTO inbound_copies (tenant, event_id, source, mailbox, delivery_id, workflow_id,
                                message_id, content_sha256)
    VALUES ($1, $2, $3, $4, $5, $10, $6, $7)
    ON CONFLICT (tenant, source, mailbox, delivery_id) DO NOTHING
    RETURNING copy_row
)
INSERT INTO audit_log (tenant, event_id, workflow_id, actor, action, detail)
SELECT $1, $2, $9, $8, 'copy_recorded', jsonb_build_object(
    'source', $3::text, 'mailbox', $4::text, 'delivery_id', $5::text,
    'content_sha256', $7::text, 'copy_row', copy_row)
FROM inserted
RETURNING 1
"""

COPIES_OF_EVENT = """
SELECT source, mailbox, delivery_id, workflow_id, received_at FROM inbound_copies
WHERE event_id = $1 ORDER BY received_at, copy_row
"""

# The item a copy's own workflow ID stands for, and the copy.
ITEM_OF_COPY = """
SELECT e.workflow_id, c.source, c.mailbox, c.delivery_id, c.workflow_id AS copy_workflow_id,
       c.received_at
FROM inbound_copies c JOIN inbound_events e ON e.event_id = c.event_id
WHERE c.workflow_id = $1
"""


async def lock_message(conn: Conn, *, tenant: str, key: str) -> None:
    """Serialise the item-or-copy decision for one message of one tenant (this transaction)."""
    await conn.execute(LOCK_MESSAGE, tenant, key)


async def copy_target(conn: Conn, *, tenant: str, source: str, mailbox: str,
                      delivery_id: str, message_id: str, content_sha256: str
                      ) -> asyncpg.Record | None:
    """The first item this delivery is a copy of (`recorded`: this delivery key was recorded
    as its copy before), or None: the delivery is an item's own, or a new message."""
    row: asyncpg.Record | None = await conn.fetchrow(
        COPY_TARGET, tenant, source, mailbox, delivery_id, message_id, content_sha256)
    return row


async def record_copy(conn: Conn, *, tenant: str, event_id: str, workflow_id: str,
                      source: str, mailbox: str, delivery_id: str, copy_workflow_id: str,
                      message_id: str, content_sha256: str, actor: str) -> bool:
    """Record the delivery as a copy of the item `event_id` (`workflow_id`), with its audit
    entry; `copy_workflow_id` is the ID the delivery would have had. False: it was recorded
    before."""
    value = await conn.fetchval(RECORD_COPY, tenant, event_id, source, mailbox, delivery_id,
                                message_id, content_sha256, actor, workflow_id,
                                copy_workflow_id)
    return value is not None


async def copies_of_event(conn: Conn, *, event_id: str) -> list[dict[str, Any]]:
    """An item's copies, oldest first, for its status."""
    rows = await conn.fetch(COPIES_OF_EVENT, event_id)
    return [{"source": r["source"], "mailbox": r["mailbox"], "delivery_id": r["delivery_id"],
             "workflow_id": r["workflow_id"], "received_at": r["received_at"].isoformat()}
            for r in rows]


async def item_of_copy(conn: Conn, *, workflow_id: str) -> asyncpg.Record | None:
    """The item a copy's own workflow ID stands for (None: no copy has that ID)."""
    row: asyncpg.Record | None = await conn.fetchrow(ITEM_OF_COPY, workflow_id)
    return row
