"""The `items` group: one item's status, the review queue, pause and resume, the audit
story, replaying a failed run, and retention (`purge`, `forget`)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated, Any

import asyncpg
import typer
from rich.table import Table

from inboxcrm.cli.common import JsonOpt, ReviewerOpt, err, fail, out, settings_from_env, with_db
from inboxcrm.domain.review_card import age_text
from inboxcrm.store import db, items, retention
from schemas.contract import WORKFLOW_TYPE, start_search_attributes


def status(workflow_id: str) -> None:
    """One item's state, reason, operations and review task, as JSON."""
    settings = settings_from_env()

    async def load(conn: asyncpg.Connection[Any]) -> dict[str, Any] | None:
        return await items.item_status(conn, workflow_id)

    found = with_db(settings, load)
    if found is None:
        fail(f"no item with workflow ID {workflow_id!r}")
    out.print_json(json.dumps(found))


def queue(tenant: Annotated[str | None, typer.Option()] = None, as_json: JsonOpt = False) -> None:
    """The owned review queue, oldest first (references and reasons, never bodies)."""
    settings = settings_from_env()

    async def load(conn: asyncpg.Connection[Any]) -> list[dict[str, Any]]:
        return await items.review_queue(conn, tenant)

    queued = with_db(settings, load)
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


def _switch(tenant: str | None, scope: str, paused: bool) -> None:
    if scope not in items.SCOPES:
        fail(f"--scope must be one of {', '.join(items.SCOPES)}")
    settings = settings_from_env()
    actor = os.environ.get("USER", "operator")

    async def apply(conn: asyncpg.Connection[Any]) -> None:
        await items.set_pause(conn, tenant, scope, paused, actor)

    with_db(settings, apply)
    out.print(f"{'paused' if paused else 'resumed'} {scope} for {tenant or 'all tenants'}")


def pause(tenant: Annotated[str | None, typer.Option()] = None, scope: ScopeOpt = "all") -> None:
    """Park CRM writes and/or sends (nothing fails; items wait and resume)."""
    _switch(tenant, scope, True)


def resume(tenant: Annotated[str | None, typer.Option()] = None, scope: ScopeOpt = "all") -> None:
    """Lift a pause, and wake the items parked on it (a signal each)."""
    from inboxcrm.operator.wake import wake_parked
    from inboxcrm.platform import temporal

    _switch(tenant, scope, False)
    settings = settings_from_env()

    async def wake() -> int:
        return await wake_parked(await temporal.connect(settings), tenant, scope)

    try:
        woken = asyncio.run(wake())
    except Exception as exc:  # noqa: BLE001 - the switch is lifted; items wake on their own
        err.print(f"[yellow]warning:[/yellow] could not signal parked items "
                  f"({type(exc).__name__}); they resume on their own within an hour")
        return
    out.print(f"woke {woken} parked item(s)")


def audit(
    email: Annotated[str | None, typer.Option("--email")] = None,
    workflow: Annotated[str | None, typer.Option("--workflow")] = None,
    tenant: Annotated[str, typer.Option()] = "acme",
    as_json: JsonOpt = False,
) -> None:
    """The whole story of a person (--email) or an event (--workflow)."""
    if (email is None) == (workflow is None):
        fail("give exactly one of --email or --workflow")
    settings = settings_from_env()
    canonical: str | None = None
    if email is not None:
        from inboxcrm.domain.policy import InvalidAddress, canonical_email, get_policy

        try:
            canonical = canonical_email(email, get_policy(tenant))
        except InvalidAddress:
            fail("not a valid email address")

    async def load(conn: asyncpg.Connection[Any]) -> list[dict[str, Any]]:
        return await items.audit_story(conn, workflow_id=workflow, canonical=canonical)

    entries = with_db(settings, load)
    if as_json:
        out.print_json(json.dumps(entries))
        return
    if not entries:
        fail("no audit entries found")
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
           reason: Annotated[str, typer.Option("--reason")]) -> None:
    """Run a failed or terminated item again under the same workflow ID and operation keys.
    Completed operations are not repeated (the ledger returns their stored results)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.common import WorkflowIDReusePolicy
    from temporalio.service import RPCError

    from inboxcrm.operator.reviewer_auth import NotAuthorised, cli_principal
    from inboxcrm.platform import temporal
    from schemas.models import InboundEmailInput

    settings = settings_from_env()

    async def run() -> None:
        conn = await db.connect(settings.database_url)
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
            client = await temporal.connect(settings)
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
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            )
            await items.record_replayed(conn, tenant=row["tenant"], event_id=row["event_id"],
                                        workflow_id=workflow_id, actor=principal.decider,
                                        reason=reason, label=reviewer)
        finally:
            await conn.close()

    asyncio.run(run())
    out.print(f"replaying {workflow_id}")


def purge(older_than: Annotated[int, typer.Option("--older-than", help="Days.")]) -> None:
    """Delete raw content of settled items older than DAYS; hashes and the decision trail
    stay."""
    if older_than < 1:
        fail("--older-than must be at least 1 day")
    settings = settings_from_env()
    actor = os.environ.get("USER", "operator")
    count = with_db(settings, lambda conn: retention.purge(conn, older_than, actor))
    out.print(f"purged raw content of {count} event(s) older than {older_than} day(s)")


def forget(email: Annotated[str, typer.Option("--email")],
           tenant: Annotated[str | None, typer.Option(help="Default: every tenant.")] = None,
           ) -> None:
    """Data-subject request: remove a person's personal data from the store (recorded)."""
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

    async def run(conn: asyncpg.Connection[Any]) -> tuple[int, int]:
        contacts = events = 0
        for address in canonical:
            report = await retention.forget(conn, tenants, address, actor)
            contacts, events = contacts + report.contacts, events + report.events
        return contacts, events

    contacts, events = with_db(settings, run)
    out.print(f"forgot {contacts} contact(s) and the content of {events} event(s); the CRM's "
              "own record must be deleted in the CRM")
