"""The `items` group: one item's status, the review queue, pause and resume, the audit
story, replaying a failed run, and retention (`purge`, `forget`, `export`)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import asyncpg
import typer
from rich.table import Table

from inboxcrm.cli.common import (
    DryRunOpt,
    JsonOpt,
    ReviewerOpt,
    YesOpt,
    confirm,
    err,
    fail,
    out,
    settings_from_env,
    with_db,
)
from inboxcrm.domain.policy import current_policies, tenant_priority
from inboxcrm.domain.review_card import age_text
from inboxcrm.schemas.contract import WORKFLOW_TYPE, start_search_attributes
from inboxcrm.store import db, items, retention
from inboxcrm.store.roles import role_of

T = TypeVar("T")


def status(workflow_id: str, as_json: Annotated[bool, typer.Option(
        "--json", help="Print JSON (what it always prints).")] = True) -> None:
    """One item's state, reason, operations and review task, as JSON."""
    settings = settings_from_env()

    async def load(conn: asyncpg.Connection[Any]) -> dict[str, Any] | None:
        return await items.item_status(conn, workflow_id)

    found = with_db(settings, load)
    if found is None:
        fail(f"no item with workflow ID {workflow_id!r}")
    out.print_json(json.dumps(found))


def queue(tenant: Annotated[str | None, typer.Option()] = None,
          owner: Annotated[str | None, typer.Option(help="Only this owner's items (the "
                                                    "policy's `owners` per cause).")] = None,
          as_json: JsonOpt = False) -> None:
    """The owned review queue, oldest first (references and reasons, never bodies)."""
    settings = settings_from_env()

    async def load(conn: asyncpg.Connection[Any]) -> list[dict[str, Any]]:
        return await items.review_queue(conn, tenant)

    queued = with_db(settings, load)
    if owner is not None:
        queued = [item for item in queued if item["owner"] == owner]
    if as_json:
        out.print_json(json.dumps(queued))
        return
    table = Table(title=f"review queue ({len(queued)} open)")
    for column in ("age", "state", "reason", "owner", "overdue", "workflow_id"):
        table.add_column(column)
    for item in queued:
        table.add_row(age_text(item["age_seconds"]), item["state"], item["reason"], item["owner"],
                      "yes" if item["overdue"] else "", item["workflow_id"])
    out.print(table)


ScopeOpt = Annotated[str, typer.Option("--scope", help="crm | send | all")]


def _switch(tenant: str | None, scope: str, paused: bool, as_json: bool) -> dict[str, Any]:
    if scope not in items.SCOPES:
        fail(f"--scope must be one of {', '.join(items.SCOPES)}")
    settings = settings_from_env()
    actor = os.environ.get("USER", "operator")

    async def apply(conn: asyncpg.Connection[Any]) -> None:
        await items.set_pause(conn, tenant, scope, paused, actor)

    with_db(settings, apply)
    if not as_json:
        out.print(f"{'paused' if paused else 'resumed'} {scope} for {tenant or 'all tenants'}")
    return {"tenant": tenant, "scope": scope, "paused": paused}


def pause(tenant: Annotated[str | None, typer.Option()] = None, scope: ScopeOpt = "all",
          as_json: JsonOpt = False) -> None:
    """Park CRM writes and/or sends (nothing fails; items wait and resume)."""
    result = _switch(tenant, scope, True, as_json)
    if as_json:
        out.print_json(json.dumps(result))


def resume(tenant: Annotated[str | None, typer.Option()] = None, scope: ScopeOpt = "all",
           as_json: JsonOpt = False) -> None:
    """Lift a pause, and wake the items parked on it (a signal each)."""
    from inboxcrm.operator.wake import wake_parked
    from inboxcrm.platform import temporal

    result = _switch(tenant, scope, False, as_json)
    settings = settings_from_env()

    async def wake() -> int:
        # The tenant's namespace, or (every tenant) each namespace in turn.
        if tenant is not None:
            return await wake_parked(await temporal.connect(settings, tenant=tenant), tenant,
                                     scope)
        shared = await temporal.connect(settings)
        woken = 0
        for namespace in temporal.tenant_namespaces(settings).served(current_policies()):
            woken += await wake_parked(temporal.in_namespace(shared, namespace), None, scope)
        return woken

    woken: int | None
    try:
        woken = asyncio.run(wake())
    except Exception as exc:  # noqa: BLE001 - the switch is lifted; items wake on their own
        err.print(f"[yellow]warning:[/yellow] could not signal parked items "
                  f"({type(exc).__name__}); they resume on their own within an hour")
        woken = None
    if as_json:
        out.print_json(json.dumps(result | {"woken": woken}))
    elif woken is not None:
        out.print(f"woke {woken} parked item(s)")


def _readable_tenants(settings: Any, only: str | None) -> list[str]:
    """The tenants `audit --email` searches: every tenant with a policy that the caller may
    read (the reviewer of INBOXCRM_REVIEWER_TOKEN: theirs; otherwise, with the database in
    hand, the operator: all), or just `--tenant`."""
    from inboxcrm.domain.policy import PolicyError, current_policies
    from inboxcrm.operator.reviewer_auth import NotAuthorised, cli_principal
    from inboxcrm.platform.reviewer_identity import operator

    try:
        known = sorted(current_policies())
    except PolicyError as exc:
        fail(str(exc))
        raise
    principal = operator()
    if os.environ.get("INBOXCRM_REVIEWER_TOKEN", "").strip():
        try:
            principal = with_db(settings, lambda conn: cli_principal(conn, os.environ, settings))
        except NotAuthorised as exc:
            fail(str(exc))
            raise
    readable = [t for t in known if principal.may_see(t)]
    if only is not None:
        if only not in known:
            fail(f"unknown tenant {only!r}: no policy file for it")
        if only not in readable:
            fail(f"tenant {only!r} is not one you may read")
        return [only]
    if not readable:
        fail("no tenant to search: you may read none of " + (", ".join(known) or "(none)"))
    return readable


def audit(
    email: Annotated[str | None, typer.Option("--email")] = None,
    workflow: Annotated[str | None, typer.Option("--workflow")] = None,
    tenant: Annotated[str | None, typer.Option(
        "--tenant", help="With --email: only this tenant (default: every tenant you may "
                         "read, each with its own address rules).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The whole story of a person (--email) or an event (--workflow)."""
    if (email is None) == (workflow is None):
        fail("give exactly one of --email or --workflow")
    settings = settings_from_env()
    identities: list[tuple[str, str]] = []
    if email is not None:
        from inboxcrm.domain.policy import InvalidAddress, canonical_email, get_policy

        for name in _readable_tenants(settings, tenant):
            try:
                identities.append((name, canonical_email(email, get_policy(name))))
            except InvalidAddress:
                fail("not a valid email address")

    async def load(conn: asyncpg.Connection[Any]) -> list[dict[str, Any]]:
        if workflow is not None:
            return await items.audit_story(conn, workflow_id=workflow)
        return await items.audit_story(conn, identities=identities)

    entries = with_db(settings, load)
    if as_json:
        out.print_json(json.dumps(entries))
        return
    if not entries:
        fail("no audit entries found" + (f" in {', '.join(t for t, _ in identities)}"
                                         if identities else ""))
    from inboxcrm.operator.audit_story import sentence, summary

    for line in summary(entries):
        out.print(f"[bold]{line}[/bold]", highlight=False)
    current = None
    for entry in entries:
        if entry["workflow_id"] != current:
            current = entry["workflow_id"]
            out.print(f"\n[bold]{current or '(operator actions)'}[/bold]", highlight=False)
        at = entry["at"][:23].replace("T", " ")
        out.print(f"  {at}  {entry['actor']:<16} {sentence(entry['action'], entry['detail'])}",
                  highlight=False, soft_wrap=True)


def replay(workflow_id: str, reviewer: ReviewerOpt,
           reason: Annotated[str, typer.Option("--reason")], as_json: JsonOpt = False) -> None:
    """Run a failed or terminated item again under the same workflow ID and operation keys.
    Completed operations are not repeated (the ledger returns their stored results)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.common import WorkflowIDReusePolicy
    from temporalio.service import RPCError

    from inboxcrm.operator.reviewer_auth import NotAuthorised, cli_principal
    from inboxcrm.platform import temporal
    from inboxcrm.schemas.models import InboundEmailInput

    settings = settings_from_env()

    async def run() -> None:
        conn = await db.connect(settings.database_url,
                                role=role_of("operator", settings.db_role))
        try:
            # As the review commands: the reviewer of INBOXCRM_REVIEWER_TOKEN (their tenants
            # only), else the operator; `--reviewer` is a label (docs/architecture.md §6).
            try:
                principal = await cli_principal(conn, os.environ, settings)
            except NotAuthorised as exc:
                fail(str(exc))
                return
            row = await items.event_of_workflow(conn, workflow_id)
            if row is None or not principal.may_see(row["tenant"]):
                fail(f"no item with workflow ID {workflow_id!r}")
                return
            client = await temporal.connect(settings, tenant=row["tenant"])
            try:
                description = await client.get_workflow_handle(workflow_id).describe()
            except RPCError:
                description = None
            allowed = {WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TERMINATED,
                       WorkflowExecutionStatus.TIMED_OUT, WorkflowExecutionStatus.CANCELED}
            if description is not None and description.status not in allowed:
                name = description.status.name if description.status else "unknown"
                fail(f"only failed or terminated runs can be replayed; this one is {name}")
            await client.start_workflow(
                WORKFLOW_TYPE,
                InboundEmailInput(event_id=str(row["event_id"]), tenant=row["tenant"]),
                id=workflow_id, task_queue=settings.task_queue,
                search_attributes=start_search_attributes(row["tenant"]),
                priority=tenant_priority(row["tenant"]),
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            )
            await items.record_replayed(conn, tenant=row["tenant"], event_id=row["event_id"],
                                        workflow_id=workflow_id, actor=principal.decider,
                                        reason=reason, label=reviewer)
        finally:
            await conn.close()

    asyncio.run(run())
    if as_json:
        out.print_json(json.dumps({"workflow_id": workflow_id, "replaying": True}))
    else:
        out.print(f"replaying {workflow_id}")


class _DryRun(Exception):
    """Raised inside a transaction to roll back what a `--dry-run` just counted."""

    def __init__(self, counted: Any) -> None:
        super().__init__("dry run")
        self.counted = counted


async def _counted(conn: asyncpg.Connection[Any], dry_run: bool,
                   change: Callable[[], Awaitable[T]]) -> T:
    """Run `change`; with `dry_run`, inside a transaction that is rolled back, so the counts
    are the real statement's and nothing stays changed (not even its audit entry)."""
    if not dry_run:
        return await change()
    try:
        async with conn.transaction():
            raise _DryRun(await change())
    except _DryRun as rolled_back:
        counted: T = rolled_back.counted
        return counted


def purge(older_than: Annotated[int, typer.Option("--older-than", help="Days.")],
          dry_run: DryRunOpt = False, yes: YesOpt = False, as_json: JsonOpt = False) -> None:
    """Delete raw content of settled items older than DAYS; hashes and the decision trail
    stay. Asks first (--yes skips; --dry-run only counts)."""
    if older_than < 1:
        fail("--older-than must be at least 1 day")
    settings = settings_from_env()
    actor = os.environ.get("USER", "operator")
    if not dry_run:
        confirm(f"Delete the raw content of every settled item older than {older_than} "
                "day(s)?", yes)
    count = with_db(settings, lambda conn: _counted(
        conn, dry_run, lambda: retention.purge(conn, older_than, actor)))
    if as_json:
        out.print_json(json.dumps({"older_than_days": older_than, "events": count,
                                   "dry_run": dry_run}))
    elif dry_run:
        out.print(f"dry run: would purge the raw content of {count} event(s) older than "
                  f"{older_than} day(s); nothing changed")
    else:
        out.print(f"purged raw content of {count} event(s) older than {older_than} day(s)")


def forget(email: Annotated[str, typer.Option("--email")],
           tenant: Annotated[str | None, typer.Option(help="Default: every tenant.")] = None,
           dry_run: DryRunOpt = False, yes: YesOpt = False, as_json: JsonOpt = False,
           ) -> None:
    """Data-subject request: remove a person's personal data from the store (recorded).
    Asks first (--yes skips; --dry-run only counts)."""
    from inboxcrm.domain.policy import InvalidAddress, canonical_email, get_policy, load_policies
    settings = settings_from_env()
    tenants = [tenant] if tenant else sorted(load_policies())
    canonical = set()
    for name in tenants:
        try:
            canonical.add(canonical_email(email, get_policy(name)))
        except InvalidAddress:
            fail("not a valid email address")
    actor = os.environ.get("USER", "operator")
    if not dry_run:
        confirm(f"Forget this person in {tenant or 'every tenant'} (contacts and message "
                "content; cannot be undone)?", yes)

    async def run(conn: asyncpg.Connection[Any]) -> tuple[int, int]:
        async def apply() -> tuple[int, int]:
            contacts = events = 0
            for address in canonical:
                report = await retention.forget(conn, tenants, address, actor)
                contacts, events = contacts + report.contacts, events + report.events
            return contacts, events

        return await _counted(conn, dry_run, apply)

    contacts, events = with_db(settings, run)
    if as_json:
        out.print_json(json.dumps({"contacts": contacts, "events": events,
                                   "tenants": tenants, "dry_run": dry_run}))
    elif dry_run:
        out.print(f"dry run: would forget {contacts} contact(s) and the content of {events} "
                  "event(s); nothing changed")
    else:
        out.print(f"forgot {contacts} contact(s) and the content of {events} event(s); the "
                  "CRM's own record must be deleted in the CRM")


def _exportable(value: Any) -> Any:
    """A row's value as JSON: times in ISO 8601, IDs as text, the stored message and the
    provider's own event as base64 (their exact bytes; `base64 -d` gives the .eml)."""
    if isinstance(value, dict):
        return {(f"{k}_base64" if k in ("raw", "provider_event") else k): _exportable(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_exportable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)  # UUIDs


def export(email: Annotated[str, typer.Option("--email")],
           tenant: Annotated[str | None, typer.Option(help="Default: every tenant.")] = None,
           output: Annotated[Path | None, typer.Option(
               "--output", "-o", help="Write the JSON to this new file (mode 0600) instead "
               "of standard output.")] = None,
           as_json: Annotated[bool, typer.Option(
               "--json", help="The export is JSON anyway; with --output, the summary too.")
           ] = False,
           ) -> None:
    """Access request: everything the store holds about a person, as JSON (contacts,
    messages with their stored bytes, matches, reviews, follow-ups, operations, copies,
    suppressions, CRM opt-out writes and the audit trail around them). Recorded in the
    audit trail without the address."""
    from inboxcrm.domain.policy import InvalidAddress, canonical_email, get_policy, load_policies
    from inboxcrm.platform.atrest import SealedValueError
    settings = settings_from_env()
    tenants = [tenant] if tenant else sorted(load_policies())
    by_tenant: dict[str, str] = {}
    for name in tenants:
        try:
            by_tenant[name] = canonical_email(email, get_policy(name))
        except InvalidAddress:
            fail("not a valid email address")
    actor = os.environ.get("USER", "operator")
    if output is not None and output.exists():
        fail(f"{output} exists; give a new file")

    async def run(conn: asyncpg.Connection[Any]) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {}
        for name, address in sorted(by_tenant.items()):
            part = await retention.export(conn, [name], address, actor)
            for kind, rows in part.items():
                found.setdefault(kind, []).extend(rows)
        return found

    try:
        found = with_db(settings, run)
    except SealedValueError as exc:  # names the column and key ID, never data
        fail(f"export stopped, nothing written: {exc}", 1)
        raise
    document = json.dumps({"tenants": tenants, **_exportable(found)}, indent=2,
                          sort_keys=True)
    if output is None:
        sys.stdout.write(document + "\n")  # as is: a console would wrap the long values
        return
    descriptor = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(document + "\n")
    if as_json:
        out.print_json(json.dumps({"output": str(output), "counts": {
            kind: len(rows) for kind, rows in sorted(found.items())}}))
        return
    counts = ", ".join(f"{len(rows)} {kind}" for kind, rows in sorted(found.items()) if rows)
    out.print(f"wrote {output}: {counts or 'nothing held about this address'}")
