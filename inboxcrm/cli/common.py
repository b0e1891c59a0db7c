"""What every command group shares: the two consoles (printing happens only in this
package), failing with a message, the settings next to a running stack, and a database
connection for one command."""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import asyncpg
import typer
from rich.console import Console
from rich.markup import escape

from inboxcrm.platform.config import Settings, get_settings
from inboxcrm.store import db

# Wide tables when piped (rich would wrap at 80 columns).
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)
T = TypeVar("T")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
ReviewerOpt = Annotated[str, typer.Option(
    "--reviewer", help="A display label; the audit records the authenticated decider "
                       "(INBOXCRM_REVIEWER_TOKEN, else the operator).")]


def fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def with_db(settings: Settings, fn: Callable[[asyncpg.Connection[Any]], Awaitable[T]]) -> T:
    async def run() -> T:
        try:
            conn = await db.connect(settings.database_url)
        except (OSError, Exception) as exc:  # noqa: BLE001 - say what is wrong, no traceback
            fail(f"cannot connect to the database ({type(exc).__name__}); is the stack up? "
                 "(`make up`, or set DATABASE_URL)")
            raise
        try:
            return await fn(conn)
        finally:
            await conn.close()
    return asyncio.run(run())


def _stack_env() -> dict[str, str]:
    """Values from .data/stack.env (written by `make up`) not already in the environment."""
    path = Path(os.environ.get("INBOXCRM_STACK_ENV", Path.cwd() / ".data" / "stack.env"))
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and key:
                values[key] = shlex.split(value)[0] if value else ""
    return values


def settings_from_env() -> Settings:
    """Settings from the environment; where the environment names no database, the values
    `make up` wrote to .data/stack.env fill in (so the CLI just works next to a stack)."""
    if not os.environ.get("DATABASE_URL"):
        for key, value in _stack_env().items():
            os.environ.setdefault(key, value)
    get_settings.cache_clear()
    return get_settings()
