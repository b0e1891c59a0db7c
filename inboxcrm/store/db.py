"""PostgreSQL connection pool shared by the relay, the worker and the CLI, and the few
statements about the server itself (a liveness probe, databases of their own for tests and
chaos runs)."""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Any

import asyncpg

from inboxcrm.store.roles import set_role

if TYPE_CHECKING:
    # What every store function takes: a connection of its own or one from the pool.
    Conn = asyncpg.Connection[Any] | asyncpg.pool.PoolConnectionProxy[Any]

PING = "SELECT true"


async def _init_connection(conn: asyncpg.Connection[Any], role: str | None = None) -> None:
    """Codecs, then the process kind's role (`inboxcrm.store.roles`) for the connection's
    whole life: the one session setting pooled code makes, before any use."""
    for name in ("json", "jsonb"):
        await conn.set_type_codec(
            name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )
    if role is not None:
        await set_role(conn, role)


async def _keep_session(conn: asyncpg.Connection[Any]) -> None:
    """Release without asyncpg's reset query (advisory unlock, CLOSE ALL, UNLISTEN, RESET ALL):
    one round trip saved per acquire. Safe because no pooled code changes session state (no
    SET beyond the role `_init_connection` sets, LISTEN, cursors or session-level advisory
    locks; only transaction-scoped ones), and asyncpg still rolls back a transaction left
    open before this runs."""


async def create_pool(database_url: str, *, min_size: int = 1, max_size: int = 10,
                      role: str | None = None) -> asyncpg.Pool:
    """`role`: the process kind's (`roles.role_of`), set on every connection; None keeps
    the login user's privileges (the tests' owner pools, INBOXCRM_DB_ROLE=false)."""
    pool = await asyncpg.create_pool(
        database_url, min_size=min_size, max_size=max_size,
        init=partial(_init_connection, role=role), reset=_keep_session,
    )
    assert pool is not None
    return pool


async def connect(database_url: str, *, role: str | None = None) -> asyncpg.Connection[Any]:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(database_url)
    try:
        await _init_connection(conn, role)
    except BaseException:
        await conn.close()
        raise
    return conn


async def ping(conn: Conn) -> bool:
    """The relay's health probe: the database answers a trivial statement."""
    return await conn.fetchval(PING) is True


async def count(conn: Conn | asyncpg.Pool, sql: str, *params: Any) -> int:
    """A count a test or probe writes itself (`inboxcrm.verify.probe.StackClient.count`):
    the one place outside a named statement where SQL text comes from the caller."""
    return int(await conn.fetchval(sql, *params))


def _quoted(name: str) -> str:
    """A database name as an SQL identifier (the names are generated: prefix and hex)."""
    return '"' + name.replace('"', '""') + '"'


async def create_database(admin: asyncpg.Connection[Any], name: str) -> None:
    await admin.execute("CREATE DATABASE " + _quoted(name))


async def drop_database(admin: asyncpg.Connection[Any], name: str) -> None:
    await admin.execute("DROP DATABASE IF EXISTS " + _quoted(name) + " WITH (FORCE)")
