"""`inboxcrm reviewer add|list|revoke` (docs/architecture.md §10): reviewers as people, each
with a personal token (shown once, stored as its SHA-256) and the tenants they review.

A sub-app of the `inboxcrm` console script, registered in `inboxcrm/cli.py`. It loads its
settings as the other commands do (the environment, else `.data/stack.env` of `make up`)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inboxcrm.platform.config import Settings, get_settings
from inboxcrm.platform.reviewer_identity import new_token, token_digest
from inboxcrm.store import db
from inboxcrm.store import reviewers as store

app = typer.Typer(no_args_is_help=True,
                  help="Reviewers and their tenants: personal tokens for the review desk "
                       "and the CLI.")
out = Console()
err = Console(stderr=True)


def _fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def _settings() -> Settings:
    """The environment; where it names no database, the values `make up` wrote."""
    if not os.environ.get("DATABASE_URL"):
        path = Path(os.environ.get("INBOXCRM_STACK_ENV", Path.cwd() / ".data" / "stack.env"))
        if path.exists():
            for line in path.read_text().splitlines():
                key, sep, value = line.partition("=")
                if sep and key:
                    os.environ.setdefault(key, shlex.split(value)[0] if value else "")
    get_settings.cache_clear()
    return get_settings()


def _actor() -> str:
    return os.environ.get("USER") or "operator"


def _run(fn: Any) -> Any:
    settings = _settings()

    async def run() -> Any:
        try:
            conn = await db.connect(settings.database_url)
        except Exception as exc:  # noqa: BLE001 - say what is wrong, no traceback
            _fail(f"cannot connect to the database ({type(exc).__name__}); is the stack up? "
                  "(`make up`, or set DATABASE_URL)")
            raise
        try:
            return await fn(conn)
        finally:
            await conn.close()
    return asyncio.run(run())


@app.command("add")
def add(name: str,
        tenant: Annotated[list[str], typer.Option("--tenant", help="A tenant this reviewer "
                                                  "reviews (repeat for more).")],
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Add a reviewer; prints their personal token ONCE (the last line, or {"token": …})."""
    tenants = sorted({t.strip() for t in tenant if t.strip()})
    if not tenants:
        _fail("give at least one --tenant")
    token = new_token()

    async def insert(conn: Any) -> dict[str, Any]:
        return await store.add_reviewer(conn, name, token_digest(token), tenants, _actor())

    try:
        row = _run(insert)
    except store.NameTaken:
        _fail(f"a reviewer named {name!r} already exists (revoke it first)")
        return
    except Exception as exc:  # noqa: BLE001 - a CHECK on the name: say what is allowed
        if "reviewers_name_check" in str(exc):
            _fail("a name is 1-64 characters: letters, digits, . _ @ -")
        raise
    if as_json:
        out.print_json(json.dumps({"name": row["name"], "tenants": row["tenants"],
                                   "token": token}))
        return
    out.print(f"reviewer {row['name']} added for {', '.join(row['tenants'])}; their personal "
              "token (shown once, give it to them; INBOXCRM_REVIEWER_TOKEN for the CLI):",
              highlight=False)
    print(token)  # noqa: T201 - the last line, exactly the token


@app.command("list")
def list_(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False
          ) -> None:
    """Every reviewer with their tenants (tokens are never shown again)."""
    rows = _run(store.list_reviewers)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table(title=f"reviewers ({sum(1 for r in rows if not r['revoked_at'])} active)")
    for column in ("name", "tenants", "added", "by", "revoked"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], ", ".join(row["tenants"]), row["created_at"][:19],
                      row["created_by"], (row["revoked_at"] or "")[:19])
    out.print(table)


@app.command("revoke")
def revoke(name: str) -> None:
    """Revoke a reviewer: their token and sessions stop working at once."""
    async def apply(conn: Any) -> dict[str, Any] | None:
        return await store.revoke_reviewer(conn, name, _actor())

    if _run(apply) is None:
        _fail(f"no active reviewer named {name!r}")
    out.print(f"reviewer {name} revoked", highlight=False)
