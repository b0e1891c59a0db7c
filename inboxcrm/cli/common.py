"""What every command group shares: the two consoles (printing happens only in this
package), failing with a message, progress on stderr, the settings next to a running stack,
a database connection for one command, `--since` times, and asking before a destructive
command."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import asyncpg
import typer
from rich.console import Console
from rich.markup import escape

from inboxcrm.platform import atrest
from inboxcrm.platform.config import InsecureSetting, MissingSetting, Settings, get_settings
from inboxcrm.store import db
from inboxcrm.store.roles import role_of

# Wide tables when piped (rich would wrap at 80 columns).
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)
T = TypeVar("T")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (needed "
                                                          "without a terminal).")]
DryRunOpt = Annotated[bool, typer.Option(
    "--dry-run", help="Count what would change, change nothing.")]
ReviewerOpt = Annotated[str, typer.Option(
    "--reviewer", help="A display label; the audit records the authenticated decider "
                       "(INBOXCRM_REVIEWER_TOKEN, else the operator).")]


def fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def progress(line: str) -> None:
    """One line of progress on stderr, so a person sees a long command working while stdout
    stays the table or the JSON a script reads."""
    err.print(line, highlight=False, markup=False, soft_wrap=True)


def confirm(question: str, yes: bool) -> None:
    """Ask before a destructive command. `--yes` skips the question; without a terminal to
    ask on (a script, a pipe) the command refuses rather than guess."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail(f"{question} Refusing without a terminal to ask on: pass --yes (or --dry-run "
             "first)")
    if not typer.confirm(question, default=False, err=True):
        fail("nothing changed", 1)


_SPAN = re.compile(r"^(\d{1,6})([smhd])$")
_SPAN_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """`--since`: a span back from now (`30s`, `90m`, `24h`, `7d`) or an ISO 8601 time, `Z`
    or an offset allowed, UTC when it names no zone. One parser for every command that takes
    it; anything else fails with the same message."""
    text = value.strip()
    now = now or datetime.now(UTC)
    span = _SPAN.match(text)
    if span:
        return now - timedelta(seconds=int(span[1]) * _SPAN_SECONDS[span[2]])
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"--since {value!r}: give a span like 30s, 90m, 24h, 7d or an ISO 8601 time")
        raise
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def with_db(settings: Settings, fn: Callable[[asyncpg.Connection[Any]], Awaitable[T]]) -> T:
    async def run() -> T:
        try:
            conn = await db.connect(settings.database_url,
                                    role=role_of("operator", settings.db_role))
        except (OSError, Exception) as exc:  # noqa: BLE001 - say what is wrong, no traceback
            fail(f"cannot connect to the database ({type(exc).__name__}); is the stack up? "
                 "(`make up`, or set DATABASE_URL)")
            raise
        try:
            return await fn(conn)
        finally:
            await conn.close()
    return asyncio.run(run())


def _stack_env_path() -> Path:
    return Path(os.environ.get("INBOXCRM_STACK_ENV", Path.cwd() / ".data" / "stack.env"))


def _stack_env() -> dict[str, str]:
    """Values from .data/stack.env (written by `make up`) not already in the environment."""
    path = _stack_env_path()
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
    hint = ""
    if not os.environ.get("DATABASE_URL"):
        for key, value in _stack_env().items():
            os.environ.setdefault(key, value)
        if not _stack_env_path().exists():
            hint = (f" (and there is no {_stack_env_path()}: run next to a stack started with "
                    "`make up`, from the repository root, or set the INBOXCRM_* variables)")
    get_settings.cache_clear()
    atrest.process_sealer.cache_clear()  # the at-rest keys of these settings
    try:
        return get_settings()
    except (InsecureSetting, MissingSetting) as exc:  # the message names the variable
        fail(f"{exc}{hint}", 2)
        raise
    except ValueError as exc:  # pydantic: a malformed value; name the fields, not the values
        locations = sorted({".".join(str(part) for part in error.get("loc", ()))
                            for error in getattr(exc, "errors", list)()})
        fail(f"invalid settings: {', '.join(locations) or exc.__class__.__name__} (see the "
             "INBOXCRM_* variables)", 2)
        raise
