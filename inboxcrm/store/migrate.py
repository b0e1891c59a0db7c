"""A small migration runner: applies inboxcrm/schemas/sql/NNN_*.sql in order, once each, and records
the versions it applied, then brings the process kinds' roles and grants to
`inboxcrm.store.roles.GRANTS`. Runs under an advisory lock so concurrent starters are safe."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from inboxcrm.store.roles import apply_grants

SQL_DIR = Path(__file__).resolve().parents[1] / "schemas" / "sql"
_LOCK_ID = 0x1B0C_C2A1


def migration_files() -> list[tuple[str, Path]]:
    files = sorted(SQL_DIR.glob("[0-9][0-9][0-9]_*.sql"))
    return [(path.stem.split("_", 1)[0], path) for path in files]


async def apply_migrations(database_url: str, *, roles: bool = True) -> list[str]:
    """Apply pending migrations, then the grants (every run, so a changed GRANTS takes
    effect without a migration); return the versions applied now. `roles=False`
    (INBOXCRM_DB_ROLE=false): no role is created or granted anything."""
    conn = await asyncpg.connect(database_url)
    applied_now: list[str] = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_ID)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version text PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, path in migration_files():
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text())
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    version,
                    path.name,
                )
            applied_now.append(version)
        if roles:
            await apply_grants(conn)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_ID)
        await conn.close()
    return applied_now
