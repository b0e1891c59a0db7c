"""Mailbox sources (docs/mailboxes.md): the registered mailboxes, the IMAP cursor and the
identity of every message read from a folder.

A message is stored under `(tenant, address, folder, UIDVALIDITY, UID)` in one transaction
with its inbound event (the ledger row of every source, `inbound_events`) and the folder's
cursor, so a watcher killed at any point either stored a message with its cursor or
neither; the next one reads it again and the unique keys answer "already stored".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from inboxcrm.store import copies, events

if TYPE_CHECKING:
    import asyncpg

    from inboxcrm.store.db import Conn

SOURCE = "imap"

ADD_MAILBOX = """
INSERT INTO mailboxes (tenant, kind, address, folder, host, port, tls, username, password_env,
                       oauth_token_env, max_connections, after_store)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT DO NOTHING
RETURNING folder
"""

GET_MAILBOX = """
SELECT * FROM mailboxes WHERE tenant = $1 AND kind = $2 AND address = $3 AND folder = $4
"""

# Each folder with the cursor of its newest UIDVALIDITY.
LIST_MAILBOXES = """
SELECT m.tenant, m.address, m.kind, m.folder, m.state, m.last_error, m.last_stored_at,
       m.last_checked_at, m.max_connections, c.uidvalidity, c.highest_uid, c.highest_modseq
FROM mailboxes m
LEFT JOIN LATERAL (
    SELECT uidvalidity, highest_uid, highest_modseq FROM imap_cursors c
    WHERE c.tenant = m.tenant AND c.address = m.address AND c.folder = m.folder
    ORDER BY c.updated_at DESC, c.uidvalidity DESC LIMIT 1
) c ON true
WHERE $1::text IS NULL OR m.tenant = $1
ORDER BY m.tenant, m.address, m.kind, m.folder
"""

MAILBOX_FOLDERS = """
SELECT kind, folder FROM mailboxes WHERE tenant = $1 AND address = $2 ORDER BY kind, folder
"""

REMOVE_MAILBOX = """
DELETE FROM mailboxes WHERE tenant = $1 AND address = $2 RETURNING kind, folder
"""

SET_STATE = """
UPDATE mailboxes SET state = $5, last_error = $6, updated_at = now()
WHERE tenant = $1 AND kind = $2 AND address = $3 AND folder = $4
"""

CURSOR = """
SELECT highest_uid FROM imap_cursors
WHERE tenant = $1 AND address = $2 AND folder = $3 AND uidvalidity = $4
"""

# Never backwards: a zombie attempt that stored an older UID late cannot lower the cursor.
ADVANCE_CURSOR = """
INSERT INTO imap_cursors (tenant, address, folder, uidvalidity, highest_uid, highest_modseq)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant, address, folder, uidvalidity) DO UPDATE
SET highest_uid = GREATEST(imap_cursors.highest_uid, EXCLUDED.highest_uid),
    highest_modseq = COALESCE(EXCLUDED.highest_modseq, imap_cursors.highest_modseq),
    updated_at = now()
"""

SEEN = """
SELECT m.role, m.event_id, e.workflow_id, e.workflow_started_at IS NOT NULL AS started
FROM imap_messages m LEFT JOIN inbound_events e ON e.event_id = m.event_id
WHERE m.tenant = $1 AND m.address = $2 AND m.folder = $3 AND m.uidvalidity = $4
  AND m.uid = $5
"""

# The same message seen in this folder under an earlier UIDVALIDITY, not yet matched by a
# message of the current one. Without a Message-ID the content hash alone decides.
EARLIER_SIGHTING = """
SELECT m.message_row, m.event_id FROM imap_messages m
WHERE m.tenant = $1 AND m.address = $2 AND m.folder = $3 AND m.uidvalidity <> $4
  AND m.content_sha256 = $6 AND m.message_id IS NOT DISTINCT FROM $5
  AND m.role <> 'too_large'
  AND NOT EXISTS (SELECT 1 FROM imap_messages r WHERE r.matched_from = m.message_row)
ORDER BY m.uidvalidity, m.uid LIMIT 1
"""

MARK_CHECKED = """
UPDATE mailboxes SET last_checked_at = now()
WHERE tenant = $1 AND kind = $2 AND address = $3 AND folder = $4
"""

INSERT_MESSAGE = """
INSERT INTO imap_messages (tenant, address, folder, uidvalidity, uid, role, event_id,
                           matched_from, message_id, content_sha256, size_bytes)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (tenant, address, folder, uidvalidity, uid) DO NOTHING
RETURNING message_row
"""

TOUCH_MAILBOX = """
UPDATE mailboxes SET last_stored_at = now(), updated_at = now()
WHERE tenant = $1 AND kind = 'imap' AND address = $2 AND folder = $3
"""

# Stored messages the mailbox's after-store action has not run on yet (a message over the
# size limit is left where it is, for a person to look at).
AFTER_STORE_PENDING = """
SELECT uid FROM imap_messages
WHERE tenant = $1 AND address = $2 AND folder = $3 AND uidvalidity = $4
  AND after_store_at IS NULL AND role <> 'too_large'
ORDER BY uid LIMIT $5
"""

AFTER_STORE_DONE = """
UPDATE imap_messages SET after_store_at = now()
WHERE tenant = $1 AND address = $2 AND folder = $3 AND uidvalidity = $4 AND uid = ANY($5)
  AND after_store_at IS NULL
"""

# Session-level, on a connection of its own (never a pooled one): the slot is held while
# the IMAP connection is open and released by PostgreSQL when that process dies.
TRY_SLOT = "SELECT pg_try_advisory_lock(hashtext($1), $2)"
RELEASE_SLOT = "SELECT pg_advisory_unlock(hashtext($1), $2)"
# The queue in front of the slots: PostgreSQL grants a contended lock in arrival order, so a
# watcher whose session just ended waits behind the one that was already waiting for its
# slot instead of taking it straight back (the watchers of an account take turns).
TURNSTILE_SLOT = -1
ENTER_TURNSTILE = "SELECT pg_advisory_lock(hashtext($1), $2)"


@dataclass(frozen=True)
class StoredMessage:
    """What storing one message did. `role`: item | copy | reseen | too_large;
    `new`: this call stored it (False: it was stored before, a duplicate read)."""

    role: str
    new: bool
    event_id: str | None
    workflow_id: str | None
    started: bool
    # Stored first by a concurrent read (a unique key answered, not our snapshot):
    # `inboxcrm_unique_conflicts_total{kind="mailbox_message"}`.
    raced: bool = False


def delivery_id(folder: str, uidvalidity: int, uid: int) -> str:
    """The item's delivery ID: `{folder}:{uidvalidity}:{uid}` (docs/architecture.md §10)."""
    return f"{folder}:{uidvalidity}:{uid}"


async def add_mailbox(conn: Conn, *, tenant: str, kind: str, address: str, folder: str,
                      host: str | None, port: int | None, tls: str | None,
                      username: str | None, password_env: str | None,
                      oauth_token_env: str | None, max_connections: int,
                      after_store: str = "none") -> bool:
    """Register one watched folder; False when it is already registered."""
    row = await conn.fetchrow(ADD_MAILBOX, tenant, kind, address, folder, host, port, tls,
                              username, password_env, oauth_token_env, max_connections,
                              after_store)
    return row is not None


async def get_mailbox(conn: Conn, *, tenant: str, kind: str, address: str,
                      folder: str) -> asyncpg.Record | None:
    return await conn.fetchrow(GET_MAILBOX, tenant, kind, address, folder)


async def list_mailboxes(conn: Conn, *, tenant: str | None) -> list[asyncpg.Record]:
    return list(await conn.fetch(LIST_MAILBOXES, tenant))


async def mailbox_folders(conn: Conn, *, tenant: str, address: str) -> list[asyncpg.Record]:
    return list(await conn.fetch(MAILBOX_FOLDERS, tenant, address))


async def remove_mailbox(conn: Conn, *, tenant: str, address: str) -> list[asyncpg.Record]:
    """Unregister every folder of the mailbox (its message identities stay: a mailbox added
    again later does not re-run what it stored before)."""
    return list(await conn.fetch(REMOVE_MAILBOX, tenant, address))


async def set_state(conn: Conn, *, tenant: str, kind: str, address: str, folder: str,
                    state: str, last_error: str | None) -> None:
    await conn.execute(SET_STATE, tenant, kind, address, folder, state, last_error)


async def mark_checked(conn: Conn, *, tenant: str, kind: str, address: str,
                       folder: str) -> None:
    """The watcher read its folder up to date just now (the stall alert's clock)."""
    await conn.execute(MARK_CHECKED, tenant, kind, address, folder)


async def cursor(conn: Conn, *, tenant: str, address: str, folder: str,
                 uidvalidity: int) -> int:
    """The highest UID stored for this folder and UIDVALIDITY (0: none yet)."""
    value = await conn.fetchval(CURSOR, tenant, address, folder, uidvalidity)
    return int(value or 0)


async def advance_cursor(conn: Conn, *, tenant: str, address: str, folder: str,
                         uidvalidity: int, uid: int, modseq: int | None) -> None:
    await conn.execute(ADVANCE_CURSOR, tenant, address, folder, uidvalidity, uid, modseq)


async def store_imap_message(conn: Conn, *, tenant: str, address: str, folder: str,
                             uidvalidity: int, uid: int, raw: bytes | None, size: int,
                             message_id: str | None, content_sha256: str | None,
                             workflow_id: str, modseq: int | None = None) -> StoredMessage:
    """Store one message read from a folder, with its cursor, in one transaction: an item
    (its inbound event, exactly the ledger row every source writes), a copy, an earlier
    sighting after a UIDVALIDITY change, or a message over the size limit (`raw` None)."""
    async with conn.transaction():
        seen = await conn.fetchrow(SEEN, tenant, address, folder, uidvalidity, uid)
        if seen is not None:
            return StoredMessage(seen["role"], False, _str(seen["event_id"]),
                                 seen["workflow_id"], bool(seen["started"]))
        # Item, copy or re-seen, decided under the lock every source takes for this message
        # of this tenant (store/copies.py): a webhook delivery of it waits here too.
        await copies.lock_message(conn, tenant=tenant,
                                  key=message_id or content_sha256 or workflow_id)
        key = delivery_id(folder, uidvalidity, uid)
        role, event_id, matched_from, copy_of = await _classify(
            conn, tenant=tenant, address=address, folder=folder, uidvalidity=uidvalidity,
            raw=raw, message_id=message_id, content_sha256=content_sha256, key=key)
        item_workflow: str | None = None
        if role == "item":
            assert raw is not None and content_sha256 is not None
            row = await events.insert_event(
                conn, tenant=tenant, source=SOURCE, mailbox=address,
                delivery_id=key, workflow_id=workflow_id, raw=raw,
                content_sha256=content_sha256, size_bytes=size, actor=f"mailbox:{SOURCE}",
                message_id=message_id)
            assert row is not None
            if not row["new"]:
                # Stored before under the same delivery key by an attempt whose identity
                # row this snapshot cannot see yet: a duplicate read, nothing more.
                return StoredMessage("item", False, str(row["event_id"]), workflow_id,
                                     bool(row["started"]), raced=True)
            event_id, item_workflow = str(row["event_id"]), workflow_id
        inserted = await conn.fetchval(
            INSERT_MESSAGE, tenant, address, folder, uidvalidity, uid, role, event_id,
            matched_from, message_id, content_sha256, size)
        await conn.execute(ADVANCE_CURSOR, tenant, address, folder, uidvalidity, uid, modseq)
        if inserted is None:
            # A concurrent attempt stored this identity first (a copy or a sighting: no
            # ledger row of ours to undo).
            return StoredMessage(role, False, event_id, None, True, raced=True)
        if role == "item":
            await conn.execute(TOUCH_MAILBOX, tenant, address, folder)
        elif role == "copy" and copy_of is not None:
            assert message_id is not None and content_sha256 is not None
            await copies.record_copy(
                conn, tenant=tenant, event_id=str(copy_of["event_id"]),
                workflow_id=copy_of["workflow_id"], source=SOURCE, mailbox=address,
                delivery_id=key, copy_workflow_id=workflow_id, message_id=message_id,
                content_sha256=content_sha256,
                actor=f"mailbox:{SOURCE}")
    return StoredMessage(role, True, event_id, item_workflow, False)


async def _classify(conn: Conn, *, tenant: str, address: str, folder: str, uidvalidity: int,
                    raw: bytes | None, message_id: str | None, content_sha256: str | None,
                    key: str) -> tuple[str, str | None, int | None, asyncpg.Record | None]:
    """(role, event_id, matched_from, the first item when a copy)."""
    if raw is None:
        return "too_large", None, None, None
    earlier = await conn.fetchrow(EARLIER_SIGHTING, tenant, address, folder, uidvalidity,
                                  message_id, content_sha256)
    if earlier is not None:
        return "reseen", _str(earlier["event_id"]), int(earlier["message_row"]), None
    if message_id is not None and content_sha256 is not None:
        # The tenant's first item of this message from any source: another folder or
        # mailbox, or a webhook (the same key the relay's intake looks up).
        first = await copies.copy_target(conn, tenant=tenant, source=SOURCE, mailbox=address,
                                         delivery_id=key, message_id=message_id,
                                         content_sha256=content_sha256)
        if first is not None:
            return "copy", str(first["event_id"]), None, first
    return "item", None, None, None


async def after_store_pending(conn: Conn, *, tenant: str, address: str, folder: str,
                              uidvalidity: int, limit: int) -> list[int]:
    rows = await conn.fetch(AFTER_STORE_PENDING, tenant, address, folder, uidvalidity, limit)
    return [int(r["uid"]) for r in rows]


async def after_store_done(conn: Conn, *, tenant: str, address: str, folder: str,
                           uidvalidity: int, uids: list[int]) -> None:
    await conn.execute(AFTER_STORE_DONE, tenant, address, folder, uidvalidity, uids)


async def mark_started(conn: Conn, *, event_id: str) -> None:
    await events.mark_started(conn, event_id=event_id)


async def count_start_failure(conn: Conn, *, event_id: str) -> None:
    await events.count_start_failure(conn, event_id=event_id)


async def try_claim_slot(conn: Conn, *, account: str, max_connections: int) -> int | None:
    """Claim one of the account's connection slots on this (dedicated) connection; None when
    all `max_connections` are held by other watchers, in any worker."""
    for slot in range(max_connections):
        if await conn.fetchval(TRY_SLOT, account, slot):
            return slot
    return None


async def release_slot(conn: Conn, *, account: str, slot: int) -> None:
    await conn.execute(RELEASE_SLOT, account, slot)


async def enter_turnstile(conn: Conn, *, account: str) -> None:
    """Wait for this account's turn to claim a slot (cancel the wait to give up)."""
    await conn.execute(ENTER_TURNSTILE, account, TURNSTILE_SLOT)


async def leave_turnstile(conn: Conn, *, account: str) -> None:
    await conn.execute(RELEASE_SLOT, account, TURNSTILE_SLOT)


def _str(value: object) -> str | None:
    return None if value is None else str(value)
