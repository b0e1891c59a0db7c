"""`inboxcrm` command line (docs/architecture.md §10)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import asyncpg
import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inboxcrm import cli_templates
from inboxcrm.platform.config import Settings, get_settings
from inboxcrm.store import db
from inboxcrm.store import items as operator
from schemas.contract import WORKFLOW_TYPE, Decision

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="inboxcrm: inbound email to CRM contacts and follow-ups, no duplicates.")
review_app = typer.Typer(no_args_is_help=True,
                         help="Reviewer decisions (Temporal updates) and the review card.")
app.add_typer(review_app, name="review")
# Wide tables when piped (rich would wrap at 80 columns).
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)
T = TypeVar("T")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def _with_db(settings: Settings, fn: Callable[[asyncpg.Connection[Any]], Awaitable[T]]) -> T:
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


# --- up --------------------------------------------------------------------------------
@app.command()
def up() -> None:
    """Start the whole local stack (embedded defaults) and keep it running until Ctrl-C."""
    from inboxcrm.stack.processes import StackError
    from inboxcrm.stack.stack import Stack, StackConfig, worker_count

    def port(name: str, default: int) -> int:
        return int(os.environ.get(name, default))

    try:
        workers = worker_count(os.environ, os.cpu_count())
    except StackError as exc:
        fail(str(exc), 2)
        raise
    config = StackConfig(
        pg_port=port("INBOXCRM_PG_PORT", 55432),
        temporal_port=port("INBOXCRM_TEMPORAL_PORT", 7233),
        temporal_ui_port=port("INBOXCRM_TEMPORAL_UI_PORT", 8233),
        sandbox_port=port("INBOXCRM_SANDBOX_PORT", 8090),
        relay_port=port("INBOXCRM_RELAY_PORT", 8080),
        worker_metrics_port=port("INBOXCRM_WORKER_METRICS_PORT", 9464),
        database_url=os.environ.get("DATABASE_URL") or None,
        temporal_address=os.environ.get("TEMPORAL_ADDRESS") or None,
        workers=workers,
    )
    stack = Stack(config)
    started = time.monotonic()

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Ctrl-C, `kill` or a supervisor stop it cleanly (SIGINT too: a shell script that
    # backgrounds `make up` starts it with SIGINT ignored).
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)
    try:
        with out.status(f"starting PostgreSQL, Temporal, sandbox, {workers} worker(s) and "
                        "relay…"):
            stack.start_all()
    except StackError as exc:
        stack.stop()
        fail(str(exc), 2)
    except KeyboardInterrupt:
        stack.stop()
        raise typer.Exit(130) from None
    env_path = stack.write_stack_env()
    out.print(f"[green]inboxcrm is up[/green] in {time.monotonic() - started:.1f}s\n")
    for key, value in stack.stack_env().items():
        out.print(f"{key}={value}", highlight=False, soft_wrap=True)
    out.print(f"\n(written to {env_path}; logs in {stack.log_dir})\n")
    out.print("Send a first signed test email:\n  [bold]inboxcrm send-test[/bold]\n"
              "then look at it:\n  inboxcrm status <workflow_id>   and the Temporal UI at "
              f"{stack.temporal_ui_url or '(your Temporal UI)'}\n\nCtrl-C stops everything; "
              "data stays under .data/ for the next `make up`.")
    try:
        while True:
            time.sleep(1)
            for name, proc in stack.processes.items():
                if not proc.alive():
                    err.print(f"[red]{name} exited[/red]; see {proc.log_path}:\n{proc.tail(800)}")
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        out.print("stopping…")
    finally:
        stack.stop()


def _stack_env() -> dict[str, str]:
    """Values from .data/stack.env (written by `make up`) not already in the environment."""
    path = Path(os.environ.get("INBOXCRM_STACK_ENV", Path.cwd() / ".data" / "stack.env"))
    values: dict[str, str] = {}
    if path.exists():
        import shlex

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


app.add_typer(cli_templates.build_app(settings_from_env), name="template")  # template preview


# --- status ----------------------------------------------------------------------------
@app.command()
def status(workflow_id: str) -> None:
    """One item's state, reason, operations and review task, as JSON."""
    settings = settings_from_env()

    async def load(conn: asyncpg.Connection[Any]) -> dict[str, Any] | None:
        return await operator.item_status(conn, workflow_id)

    found = _with_db(settings, load)
    if found is None:
        fail(f"no item with workflow ID {workflow_id!r}")
    out.print_json(json.dumps(found))


# --- extract ---------------------------------------------------------------------------
@app.command()
def extract(
    file: Annotated[Path, typer.Argument(help="An RFC 5322 message (.eml).")],
    tenant: Annotated[str, typer.Option(help="Tenant whose policy applies.")] = "acme",
    as_json: JsonOpt = False,
    source: Annotated[str, typer.Option(
        help="The inbound source the message came through (standard, postmark, mailgun, "
             "smtp): which provider verdicts on the sender are trusted.")] = "standard",
) -> None:
    """Offline extraction + validation + routing. Writes nothing."""
    from inboxcrm.domain.extraction import run_extract_command

    raise typer.Exit(run_extract_command(file, tenant, as_json, source=source))


# --- send-test -------------------------------------------------------------------------
@app.command("send-test")
def send_test(
    sender: Annotated[str, typer.Option("--from")] = "Jane Doe <jane.doe@example.com>",
    delivery_id: Annotated[str | None, typer.Option()] = None,
    eml: Annotated[Path | None, typer.Option(help="Send this .eml instead of a sample.")] = None,
) -> None:
    """Post one signed inbound email to the running relay (a first end-to-end check)."""
    from inboxcrm.verify.signing import sample_message, signed_headers, standard_body

    settings = settings_from_env()
    raw = eml.read_text(errors="replace") if eml else sample_message(sender)
    body = standard_body("acme", "sales@acme.test", delivery_id or f"test-{uuid.uuid4().hex[:12]}",
                         raw)
    relay = os.environ.get("RELAY_URL", f"http://{settings.relay_host}:{settings.relay_port}")
    try:
        response = httpx.post(f"{relay}/v1/inbound/standard", content=body,
                              headers=signed_headers(settings.webhook_secret, body), timeout=30)
    except httpx.HTTPError as exc:
        fail(f"relay not reachable at {relay} ({type(exc).__name__}); is `make up` running?")
        return
    out.print(f"HTTP {response.status_code}")
    out.print_json(response.text)


# --- queue -----------------------------------------------------------------------------
@app.command()
def queue(tenant: Annotated[str | None, typer.Option()] = None, as_json: JsonOpt = False) -> None:
    """The owned review queue, oldest first (references and reasons, never bodies)."""
    settings = settings_from_env()

    async def load(conn: asyncpg.Connection[Any]) -> list[dict[str, Any]]:
        return await operator.review_queue(conn, tenant)

    items = _with_db(settings, load)
    if as_json:
        out.print_json(json.dumps(items))
        return
    table = Table(title=f"review queue ({len(items)} open)")
    for column in ("age", "state", "reason", "owner", "overdue", "workflow_id"):
        table.add_column(column)
    for item in items:
        table.add_row(_age(item["age_seconds"]), item["state"], item["reason"], item["owner"],
                      "yes" if item["overdue"] else "", item["workflow_id"])
    out.print(table)


def _age(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


# --- review ----------------------------------------------------------------------------
def _decide(action: Decision, workflow_id: str, reviewer: str, note: str | None,
            evidence: str | None, wait_id: str | None, corrections: list[str] | None = None,
            send_followup: bool = True) -> None:
    """Send a decision as a Temporal update and wait for the workflow's answer: accepted (the
    new state is printed) or refused (the reason on stderr, exit 1)."""
    from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from inboxcrm.platform import temporal
    from schemas.contract import QUERY_STATUS
    from schemas.models import DecisionBody, ItemStatus

    pairs = [c.partition("=") for c in corrections or []]
    if any(not sep or not key for key, sep, _ in pairs):
        fail("--set takes FIELD=VALUE")
    settings = settings_from_env()

    async def send() -> tuple[str, ItemStatus]:
        client = await temporal.connect(settings)
        handle = client.get_workflow_handle(workflow_id)
        try:
            description = await handle.describe()
        except RPCError:
            fail(f"no workflow with ID {workflow_id!r}")
            raise
        if description.status != WorkflowExecutionStatus.RUNNING:
            fail(f"workflow {workflow_id!r} is not running "
                 f"({description.status.name if description.status else 'unknown'})")
        # Without --wait-id: the wait open now (the validator still refuses a stale one).
        answered = wait_id
        if answered is None:
            current = await handle.query(QUERY_STATUS, result_type=ItemStatus)
            answered = current.review.wait_id if current.review else ""
        body = DecisionBody(reviewer=reviewer, wait_id=answered, note=note, evidence=evidence,
                            corrections={key: value for key, _, value in pairs},
                            send_followup=send_followup)
        try:
            result = await handle.execute_update(action.value, body, result_type=ItemStatus)
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            fail(getattr(cause, "message", None) or str(cause) or "refused")
            raise
        return answered, result

    answered, result = asyncio.run(send())
    out.print(f"{action.value} accepted at wait {answered}: {workflow_id} is now "
              f"{result.state}" + (f" ({result.reason})" if result.reason else ""),
              highlight=False)
    if result.review is not None:
        out.print(f"open wait {result.review.wait_id}: {result.review.reason}; allowed: "
                  f"{', '.join(result.review.allowed)}", highlight=False)


@review_app.command("show")
def review_show(workflow_id: str, as_json: JsonOpt = False) -> None:
    """The review card in the terminal: message with the lines behind the reason marked,
    fields and evidence, candidates, suppression, proposed follow-up, decisions allowed now."""
    import dataclasses

    from inboxcrm.domain.review_card import build_card, render_text

    settings = settings_from_env()
    card = _with_db(settings, lambda conn: build_card(conn, workflow_id))
    if card is None:
        fail(f"no item with workflow ID {workflow_id!r}")
        return
    if as_json:
        out.print_json(json.dumps(dataclasses.asdict(card)))
        return
    for line in render_text(card):
        style = "bold yellow" if line.startswith(">> ") else (
            "bold" if line.startswith("== ") else None)
        out.print(line, style=style, highlight=False, markup=False, soft_wrap=True)


ReviewerOpt = Annotated[str, typer.Option("--reviewer", help="Who decides (recorded).")]
NoteOpt = Annotated[str | None, typer.Option("--note")]
EvidenceOpt = Annotated[str | None, typer.Option("--evidence")]
WaitOpt = Annotated[str | None, typer.Option(
    "--wait-id", help="The wait you decide on (from `review show`); default: the open one.")]


@review_app.command("approve")
def review_approve(workflow_id: str, reviewer: ReviewerOpt, note: NoteOpt = None,
                   evidence: EvidenceOpt = None, wait_id: WaitOpt = None,
                   set_: Annotated[list[str] | None, typer.Option(
                       "--set", help="Corrected field, e.g. --set sender_email=a@b.test")] = None,
                   send_followup: Annotated[bool, typer.Option(
                       "--send-followup/--no-send-followup",
                       help="Continue without the follow-up email.")] = True,
                   ) -> None:
    """Approve what the open wait asks (a follow-up approval: that intent only)."""
    _decide(Decision.APPROVE, workflow_id, reviewer, note, evidence, wait_id, set_,
            send_followup)


@review_app.command("hold")
def review_hold(workflow_id: str, reviewer: ReviewerOpt, note: NoteOpt = None,
                evidence: EvidenceOpt = None, wait_id: WaitOpt = None) -> None:
    """Keep the item parked (state `held`) until another decision."""
    _decide(Decision.HOLD, workflow_id, reviewer, note, evidence, wait_id)


@review_app.command("reject")
def review_reject(workflow_id: str, reviewer: ReviewerOpt, note: NoteOpt = None,
                  evidence: EvidenceOpt = None, wait_id: WaitOpt = None) -> None:
    """End the item as `rejected`: nothing more is sent or written."""
    _decide(Decision.REJECT, workflow_id, reviewer, note, evidence, wait_id)


@review_app.command("retry")
def review_retry(workflow_id: str, reviewer: ReviewerOpt, note: NoteOpt = None,
                 evidence: EvidenceOpt = None, wait_id: WaitOpt = None) -> None:
    """Retry a blocked/ambiguous step with the same operation key (a fresh bounded budget)."""
    _decide(Decision.RETRY, workflow_id, reviewer, note, evidence, wait_id)


@review_app.command("resolve")
def review_resolve(workflow_id: str, reviewer: ReviewerOpt, note: NoteOpt = None,
                   evidence: EvidenceOpt = None, wait_id: WaitOpt = None) -> None:
    """Mark the blocked/ambiguous side effect as done, with evidence (e.g. the CRM record ID)."""
    _decide(Decision.RESOLVE, workflow_id, reviewer, note, evidence, wait_id)


# --- pause / resume --------------------------------------------------------------------
ScopeOpt = Annotated[str, typer.Option("--scope", help="crm | send | all")]


def _switch(tenant: str | None, scope: str, paused: bool) -> None:
    if scope not in operator.SCOPES:
        fail(f"--scope must be one of {', '.join(operator.SCOPES)}")
    settings = settings_from_env()
    actor = os.environ.get("USER", "operator")

    async def apply(conn: asyncpg.Connection[Any]) -> None:
        await operator.set_pause(conn, tenant, scope, paused, actor)

    _with_db(settings, apply)
    out.print(f"{'paused' if paused else 'resumed'} {scope} for {tenant or 'all tenants'}")


@app.command()
def pause(tenant: Annotated[str | None, typer.Option()] = None, scope: ScopeOpt = "all") -> None:
    """Park CRM writes and/or sends (nothing fails; items wait and resume)."""
    _switch(tenant, scope, True)


@app.command()
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


# --- audit -----------------------------------------------------------------------------
@app.command()
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
        return await operator.audit_story(conn, workflow_id=workflow, canonical=canonical)

    entries = _with_db(settings, load)
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


# --- replay ----------------------------------------------------------------------------
@app.command()
def replay(workflow_id: str, reviewer: ReviewerOpt,
           reason: Annotated[str, typer.Option("--reason")]) -> None:
    """Run a failed or terminated item again under the same workflow ID and operation keys.
    Completed operations are not repeated (the ledger returns their stored results)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.common import WorkflowIDReusePolicy
    from temporalio.service import RPCError

    from inboxcrm.platform import temporal
    from schemas.models import InboundEmailInput

    settings = settings_from_env()

    async def run() -> None:
        conn = await db.connect(settings.database_url)
        try:
            row = await conn.fetchrow(
                "SELECT event_id, tenant FROM inbound_events WHERE workflow_id = $1", workflow_id)
            if row is None:
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
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            )
            await conn.execute(
                "INSERT INTO audit_log (tenant, event_id, workflow_id, actor, action, detail)"
                " VALUES ($1, $2, $3, $4, 'replayed', $5)",
                row["tenant"], row["event_id"], workflow_id, reviewer, {"reason": reason},
            )
        finally:
            await conn.close()

    asyncio.run(run())
    out.print(f"replaying {workflow_id}")


# --- retention -------------------------------------------------------------------------
@app.command()
def purge(older_than: Annotated[int, typer.Option("--older-than", help="Days.")]) -> None:
    """Delete raw content of settled items older than DAYS; hashes and the decision trail
    stay."""
    from inboxcrm.operator import retention

    if older_than < 1:
        fail("--older-than must be at least 1 day")
    settings = settings_from_env()
    actor = os.environ.get("USER", "operator")
    count = _with_db(settings, lambda conn: retention.purge(conn, older_than, actor))
    out.print(f"purged raw content of {count} event(s) older than {older_than} day(s)")


@app.command()
def forget(email: Annotated[str, typer.Option("--email")],
           tenant: Annotated[str | None, typer.Option(help="Default: every tenant.")] = None,
           ) -> None:
    """Data-subject request: remove a person's personal data from the store (recorded)."""
    from inboxcrm.domain.policy import InvalidAddress, canonical_email, get_policy, load_policies
    from inboxcrm.operator import retention

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

    contacts, events = _with_db(settings, run)
    out.print(f"forgot {contacts} contact(s) and the content of {events} event(s); the CRM's "
              "own record must be deleted in the CRM")


# --- rehearse --------------------------------------------------------------------------
@app.command()
def rehearse(timeout: Annotated[float, typer.Option(help="Seconds per scenario.")] = 90) -> None:
    """Run the synthetic failure rehearsal against the running stack; exit 1 on any failure."""
    from inboxcrm.verify.probe import Endpoints, StackClient
    from inboxcrm.verify.rehearsal import Rehearsal

    settings = settings_from_env()
    if settings.crm_url or settings.mail_url:
        fail("the rehearsal injects faults into the sandbox; it refuses to run while a real "
             "CRM or mail provider is configured (INBOXCRM_CRM_URL / INBOXCRM_MAIL_URL)")
    relay = os.environ.get("RELAY_URL", f"http://{settings.relay_host}:{settings.relay_port}")
    endpoints = Endpoints(relay, settings.sandbox_url, settings.temporal_address,
                          settings.webhook_secret)

    async def run() -> list[Any]:
        pool = await db.create_pool(settings.database_url, max_size=5)
        client = StackClient(endpoints, pool, settings)
        try:
            return await Rehearsal(client, timeout).run()
        finally:
            await client.aclose()
            await pool.close()

    outcomes = asyncio.run(run())
    table = Table(title="inboxcrm rehearsal")
    for column in ("scenario", "expected", "CRM records", "emails", "final state", "result",
                   "note"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(o.scenario, o.expected, str(o.crm_records), str(o.emails), o.final_state,
                      "[green]pass[/green]" if o.passed else "[red]FAIL[/red]", o.note)
    out.print(table)
    failed = [o for o in outcomes if not o.passed]
    out.print(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed")
    if failed:
        raise typer.Exit(1)


# --- check -----------------------------------------------------------------------------
@app.command()
def check(
    as_json: JsonOpt = False,
    settled: Annotated[bool, typer.Option(
        "--settled", help="Items still in flight count as violations (once all is quiet).")
    ] = False,
    scope: Annotated[str | None, typer.Option(
        "--scope", help="Only items whose workflow ID starts with this, e.g. inbound/acme/.")
    ] = None,
    sandbox_url: Annotated[str | None, typer.Option(
        "--sandbox-url", help="Destination to inspect (default: the stack's sandbox).")] = None,
    no_destination: Annotated[bool, typer.Option(
        "--no-destination", help="Skip the destination checks.")] = False,
) -> None:
    """Invariant checker: duplicates, lost or unowned items, attempt bounds (IDs only, never
    addresses). Exit 1 on any violation, 2 if the destination cannot be read."""
    from inboxcrm.verify import check as checker

    settings = settings_from_env()
    sandbox = (os.environ.get("INBOXCRM_SANDBOX_URL") or os.environ.get("SANDBOX_URL")
               or settings.sandbox_url)
    salesforce = getattr(settings, "crm_provider", "sandbox") == "salesforce"
    instance = getattr(settings, "salesforce_instance_url", None) or ""
    real_destination = bool(settings.crm_url or settings.mail_url or (
        salesforce and instance and not instance.startswith(sandbox)))
    url: str | None = None
    if not no_destination:
        # Only the sandbox can be inspected; with a real CRM or mail provider the
        # destination checks are skipped (and the report says so).
        url = sandbox_url or (None if real_destination else sandbox)
    crm_id_property, note_id_property = settings.crm_id_property, "inboxcrm_note_id"
    if salesforce:
        crm_id_property = settings.salesforce_external_id_field
        note_id_property = settings.salesforce_note_external_id_field

    async def run(conn: asyncpg.Connection[Any]) -> Any:
        try:
            return await checker.check_invariants(
                conn, url, settled=settled, scope=scope, crm_id_property=crm_id_property,
                note_id_property=note_id_property)
        except checker.CheckError as exc:
            fail(f"{exc} (--no-destination skips it)", 2)
            raise

    report = _with_db(settings, run)
    if as_json:
        out.print_json(json.dumps(report.to_json()))
    else:
        table = Table(title="inboxcrm invariants" + (" (settled)" if settled else "")
                      + (f" — scope {scope}" if scope else ""))
        for column in ("check", "examined", "violations", "note"):
            table.add_column(column, overflow="fold")
        for name, examined, count, note in checker.summary_rows(report):
            table.add_row(name, examined, count if count == "0" else f"[red]{count}[/red]",
                          note)
        out.print(table)
        out.print(report.destination_note)
        for result in report.results:
            for item in sorted(result.violations)[:checker.MAX_IDS]:
                out.print(f"[red]violation[/red] {result.name}: {item}", highlight=False)
        out.print(f"{report.violations} violation(s); {len(report.in_flight)} in flight")
    if not report.ok:
        raise typer.Exit(1)


# --- reconcile -------------------------------------------------------------------------
_SPAN = re.compile(r"^(\d{1,6})([smhd])$")
_SPAN_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def _since(value: str, now: datetime) -> datetime:
    """`24h`, `90m`, `7d`, `30s`, or an ISO 8601 time (UTC when it names no zone)."""
    span = _SPAN.match(value.strip())
    if span:
        return now - timedelta(seconds=int(span[1]) * _SPAN_SECONDS[span[2]])
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        fail(f"--since {value!r}: give a span like 24h, 90m, 7d or an ISO 8601 time")
        raise
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _drift_json(report: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from schemas.drift import DriftKind

    return {**asdict(report), "drift": report.drift,
            "counts": {kind.value: report.count(kind) for kind in DriftKind}}


def _print_drift(report: Any, title: str) -> None:
    from schemas.drift import CHECKED_ACTIONS, DriftKind

    table = Table(title=title)
    table.add_column("finding")
    table.add_column("count", justify="right")
    for kind in DriftKind:
        count = report.count(kind)
        table.add_row(kind.value, f"[red]{count}[/red]" if count else "0")
    out.print(table)
    out.print(f"run {report.run_id}: sampled {report.sampled} of "
              f"{report.completed_in_window} completed operations "
              f"({', '.join(CHECKED_ACTIONS)}) finished between {report.window_start} and "
              f"{report.window_end}; asked CRM {report.crm}, mail {report.mail}; report "
              f"{report.report_id} at {report.finished_at}. Only the sampled operations were "
              "checked: a clean report does not prove that every message reached the CRM.",
              highlight=False)
    for finding in report.findings:
        colour = "yellow" if finding.kind in ("unverifiable", "unchecked") else "red"
        out.print(f"[{colour}]{finding.kind}[/{colour}] {finding.subject} {finding.detail}"
                  + (f" ({finding.op_key})" if finding.op_key else ""), highlight=False)


@app.command()
def reconcile(
    since: Annotated[str | None, typer.Option(
        "--since", help="Check now the operations completed since then (24h, 90m, 7d or an "
        "ISO 8601 time). Without it: the latest scheduled report.")] = None,
    sample: Annotated[int | None, typer.Option(
        "--sample", min=1, max=10_000,
        help="Operations to check (default INBOXCRM_DRIFT_CHECK_SAMPLE_SIZE).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Drift between the ledger and the destinations, asked through the adapters: CRM
    records missing or changed behind our back, follow-ups the provider does not know,
    provider message IDs used twice. Prints the on-demand report (with --since) and the
    latest scheduled one. Exit 1 on drift, 2 when there is no report to show."""
    from activities.drift import run_drift_check
    from inboxcrm.adapters.factory import ConfigurationError, build_crm, build_mail
    from inboxcrm.store import drift as drift_store
    from schemas.drift import DriftCheckRequest, DriftReport, Trigger

    settings = settings_from_env()
    now = datetime.now(UTC)
    start = _since(since, now) if since is not None else None

    async def check_now() -> Any:
        assert start is not None
        try:
            crm, mail = build_crm(settings), build_mail(settings)
        except ConfigurationError as exc:
            fail(str(exc), 2)
            raise
        pool = await db.create_pool(settings.database_url, max_size=2)
        try:
            request = DriftCheckRequest(
                window_start=start.isoformat(), window_end=now.isoformat(),
                sample_size=sample or settings.drift_check_sample_size,
                trigger=Trigger.ON_DEMAND.value)
            return await run_drift_check(pool, crm, mail, request,
                                         run_id=f"cli:{uuid.uuid4()}")
        finally:
            await pool.close()
            await crm.aclose()
            await mail.aclose()

    async def latest(conn: asyncpg.Connection[Any]) -> DriftReport | None:
        return await drift_store.latest_report(conn, Trigger.SCHEDULE.value)

    scheduled = _with_db(settings, latest)
    on_demand = asyncio.run(check_now()) if start is not None else None
    shown = on_demand or scheduled
    if as_json:
        out.print_json(json.dumps({
            "on_demand": _drift_json(on_demand) if on_demand else None,
            "latest_scheduled": _drift_json(scheduled) if scheduled else None}))
    else:
        if on_demand is not None:
            _print_drift(on_demand, "drift check (on demand)")
        if scheduled is not None:
            _print_drift(scheduled, "latest scheduled drift check")
        else:
            out.print("no scheduled drift check has run yet (its Temporal Schedule is "
                      "registered by `make up` and deploy/bootstrap.py)")
    if shown is None:
        raise typer.Exit(2)
    if shown.drift:
        raise typer.Exit(1)


# --- chaos -----------------------------------------------------------------------------
@app.command()
def chaos(
    events: Annotated[int, typer.Option(min=1, help="Distinct deliveries.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the event mix and of the faults.")] = 1,
    kills: Annotated[int, typer.Option(min=0, help="Worker kill -9s.")] = 3,
    concurrency: Annotated[int, typer.Option(min=1, help="Posts in flight at once.")] = 20,
    rate: Annotated[float, typer.Option(help="Deliveries started per second.")] = 10.0,
    data_dir: Annotated[Path, typer.Option(help="The stack's own data directory.")] = Path(
        ".data/chaos"),
    keep_database: Annotated[bool, typer.Option(
        "--keep-database", help="Keep the run's database when a violation is found.")] = False,
    freeze: Annotated[float, typer.Option(
        min=0, help="Long-fault phase: seconds the store is frozen (SIGSTOP) with sends "
        "paused over the run; 0 turns it off.")] = 0.0,
) -> None:
    """Chaos run on a fresh stack of its own (free ports, fresh database): concurrent
    deliveries and redeliveries, sandbox faults, worker kill -9s, a relay restart, then
    operator resolution and the settled invariant check. Exit 1 on a violation, 2 if the run
    did not reach its targets (fault share, kills, restart, drained queue)."""
    from inboxcrm.stack.processes import StackError
    from inboxcrm.verify.chaos import ChaosConfig, run_on_fresh_stack, summary_rows

    config = ChaosConfig(events=events, seed=seed, kills=kills, concurrency=concurrency,
                         rate=rate, deadline=max(1800.0, events * 3.0) + freeze * 2,
                         freeze_seconds=freeze)
    try:
        result = run_on_fresh_stack(config, data_dir.resolve(),
                                    lambda line: out.print(line, highlight=False, markup=False),
                                    keep_database=keep_database)
    except StackError as exc:
        fail(str(exc), 2)
        return
    table = Table(title=f"inboxcrm chaos (events {events}, seed {seed})")
    table.add_column("metric")
    table.add_column("value", overflow="fold")
    for metric, value in summary_rows(result):
        table.add_row(metric, value)
    out.print(table)
    for item in result.stats.notes[:20]:
        out.print(f"note: {item}", highlight=False, markup=False)
    for check_result in result.report.results:
        for item in sorted(check_result.violations)[:50]:
            out.print(f"[red]violation[/red] {check_result.name}: {item}", highlight=False)
    raise typer.Exit(result.exit_code)


# --- hubspot-setup ---------------------------------------------------------------------
@app.command("hubspot-setup")
def hubspot_setup(
    property_name: Annotated[str | None, typer.Option(
        "--property", help="Default: INBOXCRM_CRM_ID_PROPERTY.")] = None,
    url: Annotated[str | None, typer.Option(
        help="HubSpot API base URL. Default: INBOXCRM_CRM_URL, else https://api.hubapi.com.")
    ] = None,
) -> None:
    """Create the unique contact property HubSpot upserts are keyed by (once per portal;
    idempotent). Needs INBOXCRM_CRM_TOKEN with the crm.schemas.contacts.write scope."""
    from inboxcrm.operator.hubspot_setup import HUBSPOT_API, SetupError, run_note_setup, run_setup

    settings = get_settings()
    if not settings.crm_token:
        fail("set INBOXCRM_CRM_TOKEN (a HubSpot private-app token)", 2)
        return
    name = property_name or settings.crm_id_property
    try:
        base = url or settings.crm_url or HUBSPOT_API
        result = asyncio.run(run_setup(base, settings.crm_token, name,
                                       timeout=settings.http_timeout_seconds))
        note = asyncio.run(run_note_setup(base, settings.crm_token,
                                          timeout=settings.http_timeout_seconds))
    except SetupError as exc:
        fail(str(exc))
        return
    out.print(f"contact property {result.name}: {result.status} (unique)", highlight=False)
    out.print(f"note property {note.name}: {note.status} (unique)", highlight=False)


def main() -> None:
    code: int = 0
    try:
        app()
    except SystemExit as exc:  # typer's standalone mode ends every command with one
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    # Exit without interpreter teardown: the Temporal SDK's native threads can crash a
    # normal shutdown after the work is done (temporalio/sdk-python#300), which would turn
    # a success into a signal exit code.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
