"""`inboxcrm reviewer add|list|rotate|revoke|role` (docs/architecture.md §10): reviewers as people,
each with a personal token (shown once, stored as its SHA-256) and the tenants they review. A
name is a person's for good: the audit and every decision proof say `reviewer:NAME`, so the
name of a revoked reviewer is never given to anyone else; `rotate` gives the same person a
new token; `--role` (e.g. `lead`) is what a policy's authority rule asks for."""

from __future__ import annotations

import json
import os
import re
from typing import Annotated, Any

import typer
from rich.table import Table

from inboxcrm.cli.common import JsonOpt, fail, out, settings_from_env, with_db
from inboxcrm.platform.reviewer_identity import new_token, token_digest
from inboxcrm.store import reviewers

reviewer_app = typer.Typer(no_args_is_help=True,
                           help="Reviewers and their tenants: personal tokens for the review "
                                "desk and the CLI.")


# A role names what a policy's authority rule may ask for (`authority.repeat_customer_facing`).
ROLE_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
RoleOpt = Annotated[str, typer.Option("--role", help="The reviewer's role, e.g. `lead`: a "
                                      "tenant policy's `authority.repeat_customer_facing` "
                                      "names the role that may retry an ambiguous send.")]


def _check_role(role: str) -> None:
    if not ROLE_PATTERN.match(role):
        fail("a role is 1-32 characters: lower-case letters, digits, _ and -, starting with a "
             "letter")


def _actor() -> str:
    return os.environ.get("USER") or "operator"


def _run(fn: Any) -> Any:
    return with_db(settings_from_env(), fn)


@reviewer_app.command("add")
def add(name: str,
        tenant: Annotated[list[str], typer.Option("--tenant", help="A tenant this reviewer "
                                                  "reviews (repeat for more).")],
        role: RoleOpt = "reviewer",
        as_json: JsonOpt = False) -> None:
    """Add a reviewer; prints their personal token ONCE (the last line, or {"token": …})."""
    tenants = sorted({t.strip() for t in tenant if t.strip()})
    if not tenants:
        fail("give at least one --tenant")
    _check_role(role)
    token = new_token()

    async def insert(conn: Any) -> dict[str, Any]:
        return await reviewers.add_reviewer(conn, name, token_digest(token), tenants, _actor(),
                                            role)

    try:
        row = _run(insert)
    except reviewers.NameTaken:
        fail(f"a reviewer named {name!r} already exists (`inboxcrm reviewer rotate {name}` "
             "gives them a new token)")
        return
    except reviewers.NameRetired:
        fail(f"the name {name!r} belonged to a revoked reviewer and is not reused (the audit "
             "names them by it); choose another name")
        return
    except Exception as exc:  # noqa: BLE001 - a CHECK on the name: say what is allowed
        if "reviewers_name_check" in str(exc):
            fail("a name is 1-64 characters: letters, digits, . _ @ -")
        raise
    if as_json:
        out.print_json(json.dumps({"name": row["name"], "tenants": row["tenants"],
                                   "role": row["role"], "token": token}))
        return
    out.print(f"reviewer {row['name']} ({row['role']}) added for {', '.join(row['tenants'])}; "
              "their personal "
              "token (shown once, give it to them; INBOXCRM_REVIEWER_TOKEN for the CLI):",
              highlight=False)
    print(token)  # noqa: T201 - the last line, exactly the token


@reviewer_app.command("list")
def list_(as_json: JsonOpt = False
          ) -> None:
    """Every reviewer with their tenants (tokens are never shown again)."""
    rows = _run(reviewers.list_reviewers)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table(title=f"reviewers ({sum(1 for r in rows if not r['revoked_at'])} active)")
    for column in ("name", "tenants", "role", "added", "by", "revoked"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], ", ".join(row["tenants"]), row["role"],
                      row["created_at"][:19],
                      row["created_by"], (row["revoked_at"] or "")[:19])
    out.print(table)


@reviewer_app.command("rotate")
def rotate(name: str, as_json: JsonOpt = False) -> None:
    """A new personal token for a reviewer (the old one and their desk sessions end at once);
    the same person, name and tenants. Prints the token ONCE (the last line, or {"token": …})."""
    token = new_token()

    async def apply(conn: Any) -> dict[str, Any] | None:
        return await reviewers.rotate_token(conn, name=name, token_sha256=token_digest(token),
                                            actor=_actor())

    row = _run(apply)
    if row is None:
        fail(f"no active reviewer named {name!r}")
        return
    if as_json:
        out.print_json(json.dumps({"name": row["name"], "tenants": row["tenants"],
                                   "token": token}))
        return
    out.print(f"reviewer {name}: new token (the old one no longer works; shown once):",
              highlight=False)
    print(token)  # noqa: T201 - the last line, exactly the token


@reviewer_app.command("revoke")
def revoke(name: str, as_json: JsonOpt = False) -> None:
    """Revoke a reviewer: their token and sessions stop working at once."""
    async def apply(conn: Any) -> dict[str, Any] | None:
        return await reviewers.revoke_reviewer(conn, name, _actor())

    if _run(apply) is None:
        fail(f"no active reviewer named {name!r}")
    if as_json:
        out.print_json(json.dumps({"name": name, "revoked": True}))
        return
    out.print(f"reviewer {name} revoked", highlight=False)


@reviewer_app.command("role")
def role_(name: str, role: Annotated[str, typer.Argument(help="The new role, e.g. `lead`.")],
          as_json: JsonOpt = False) -> None:
    """Give an active reviewer another role (audited); their token stays the same."""
    _check_role(role)

    async def apply(conn: Any) -> dict[str, Any] | None:
        return await reviewers.set_role(conn, name=name, role=role, actor=_actor())

    if _run(apply) is None:
        fail(f"no active reviewer named {name!r}")
    if as_json:
        out.print_json(json.dumps({"name": name, "role": role}))
        return
    out.print(f"reviewer {name} is now {role}", highlight=False)
