"""PostgreSQL connection pool shared by the relay, the worker and the CLI, and the few
statements about the server itself (a liveness probe, databases of their own for tests and
chaos runs)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    # What every store function takes: a connection of its own or one from the pool.
    Conn = asyncpg.Connection[Any] | asyncpg.pool.PoolConnectionProxy[Any]

PING = "SELECT true"


async def _init_connection(conn: asyncpg.Connection[Any]) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(
            name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )


async def _keep_session(conn: asyncpg.Connection[Any]) -> None:
    """Release without asyncpg's reset query (advisory unlock, CLOSE ALL, UNLISTEN, RESET ALL):
    one round trip saved per acquire. Safe because no pooled code changes session state (no
    SET, LISTEN, cursors or session-level advisory locks; only transaction-scoped ones), and
    asyncpg still rolls back a transaction left open before this runs."""


async def create_pool(database_url: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        database_url, min_size=min_size, max_size=max_size, init=_init_connection,
        reset=_keep_session,
    )
    assert pool is not None
    return pool


async def connect(database_url: str) -> asyncpg.Connection[Any]:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(database_url)
    await _init_connection(conn)
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
