"""The push sources' subscriptions (`mailbox_subscriptions`, migration 061): Gmail's watch
and Graph's subscription per mailbox folder, the API cursor the watcher catches up from,
and when each lapses (docs/mailboxes.md)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncpg

    from inboxcrm.store.db import Conn

_COLUMNS = ("tenant, kind, address, folder, subscription_id, client_state_sha256, cursor, "
            "expires_at, renewed_at, updated_at")


async def get_subscription(conn: Conn, *, tenant: str, kind: str, address: str,
                           folder: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM mailbox_subscriptions "
        "WHERE tenant = $1 AND kind = $2 AND address = $3 AND folder = $4",
        tenant, kind, address, folder)


async def by_subscription_id(conn: Conn, *, kind: str,
                             subscription_id: str) -> asyncpg.Record | None:
    """The mailbox folder a notification's subscription belongs to (None: not ours)."""
    return await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM mailbox_subscriptions "
        "WHERE kind = $1 AND subscription_id = $2", kind, subscription_id)


async def record_subscription(conn: Conn, *, tenant: str, kind: str, address: str,
                              folder: str, subscription_id: str | None,
                              client_state_sha256: str | None,
                              expires_at: datetime | None) -> None:
    """A watch or subscription created or renewed; the cursor is left as it is."""
    await conn.execute(
        """
        INSERT INTO mailbox_subscriptions (tenant, kind, address, folder, subscription_id,
                                           client_state_sha256, expires_at, renewed_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, now())
        ON CONFLICT (tenant, kind, address, folder) DO UPDATE
        SET subscription_id = EXCLUDED.subscription_id,
            client_state_sha256 = EXCLUDED.client_state_sha256,
            expires_at = EXCLUDED.expires_at, renewed_at = now(), updated_at = now()
        """, tenant, kind, address, folder, subscription_id, client_state_sha256, expires_at)


async def advance_cursor(conn: Conn, *, tenant: str, kind: str, address: str, folder: str,
                         cursor: str) -> None:
    """The API cursor after what it covers was stored: call it in the same transaction as
    the messages it covers, so a crash between the two can only re-read, never skip."""
    await conn.execute(
        """
        INSERT INTO mailbox_subscriptions (tenant, kind, address, folder, cursor)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (tenant, kind, address, folder) DO UPDATE
        SET cursor = EXCLUDED.cursor, updated_at = now()
        """, tenant, kind, address, folder, cursor)


async def drop_subscription(conn: Conn, *, tenant: str, kind: str, address: str,
                            folder: str) -> None:
    """The provider removed the subscription (Graph `subscriptionRemoved`): the watcher
    creates a new one and catches up from the cursor, which stays."""
    await conn.execute(
        """
        UPDATE mailbox_subscriptions
        SET subscription_id = NULL, client_state_sha256 = NULL, expires_at = NULL,
            updated_at = now()
        WHERE tenant = $1 AND kind = $2 AND address = $3 AND folder = $4
        """, tenant, kind, address, folder)
