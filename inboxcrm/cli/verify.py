"""The `verify` group: the invariant checker (`check`), the failure rehearsal (`rehearse`),
drift against the destinations (`reconcile`) and the chaos run (`chaos`)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import asyncpg
import typer
from rich.table import Table

from inboxcrm.cli.common import (
    JsonOpt,
    fail,
    out,
    parse_since,
    progress,
    settings_from_env,
    with_db,
)
from inboxcrm.store import db
from inboxcrm.store.roles import role_of


def rehearse(timeout: Annotated[float, typer.Option(help="Seconds per scenario.")] = 90,
             as_json: JsonOpt = False) -> None:
    """Run the synthetic failure rehearsal against the running stack (a line per scenario on
    stderr, the table and per case the CRM record, queue entry and evidence, or JSON, on
    stdout); exit 1 on any failure. Refuses unless every live worker of the rehearsal
    tenant reports the sandbox as its CRM and mail destination."""
    from dataclasses import asdict

    from inboxcrm.store import worker_destinations
    from inboxcrm.verify.probe import Endpoints, StackClient
    from inboxcrm.verify.rehearsal import (
        TENANT,
        OwnWorkers,
        Rehearsal,
        destination_problems,
    )

    settings = settings_from_env()
    if (settings.crm_url or settings.mail_url or settings.crm_provider != "sandbox"
            or settings.mail_provider != "sandbox"):
        fail("the rehearsal injects faults into the sandbox; it refuses to run while a real "
             "CRM or mail provider is configured (INBOXCRM_CRM_URL / INBOXCRM_MAIL_URL / "
             "INBOXCRM_CRM_PROVIDER / INBOXCRM_MAIL_PROVIDER)")
    relay = os.environ.get("RELAY_URL", f"http://{settings.relay_host}:{settings.relay_port}")
    endpoints = Endpoints(relay, settings.sandbox_url, settings.temporal_address,
                          settings.webhook_secret)

    def own_workers(**overrides: str) -> OwnWorkers:
        return OwnWorkers(os.environ, settings.task_queue, overrides)

    async def run() -> list[Any]:
        try:
            pool = await db.create_pool(settings.database_url, max_size=5,
                                        role=role_of("operator", settings.db_role))
        except (OSError, Exception) as exc:  # noqa: BLE001 - say what is wrong, no traceback
            fail(f"cannot connect to the database ({type(exc).__name__}); is the stack up? "
                 "(`make up`, or set DATABASE_URL)")
            raise
        try:
            async with pool.acquire() as conn:
                workers = await worker_destinations.live_for_tenant(
                    conn, tenant=TENANT, max_age_seconds=worker_destinations.LIVE_SECONDS)
            problems = destination_problems([dict(w) for w in workers], settings.sandbox_url)
            if problems:
                fail("the rehearsal injects faults into the sandbox; it refuses to run while "
                     "a worker would call anything else:\n  " + "\n  ".join(problems))
            progress(f"{len(workers)} live worker(s) of {TENANT} point at the sandbox")
            client = StackClient(endpoints, pool, settings)
            try:
                return await Rehearsal(client, timeout, progress, own_workers).run()
            finally:
                await client.aclose()
        finally:
            await pool.close()

    progress(f"rehearsal against the relay at {relay} and the sandbox at "
             f"{settings.sandbox_url}")
    outcomes = asyncio.run(run())
    failed = [o for o in outcomes if not o.passed]
    if as_json:
        out.print_json(json.dumps({"scenarios": [asdict(o) for o in outcomes],
                                   "passed": len(outcomes) - len(failed),
                                   "failed": len(failed)}))
    else:
        table = Table(title="inboxcrm rehearsal")
        for column in ("scenario", "expected", "CRM records", "emails", "final state",
                       "result", "note"):
            table.add_column(column)
        for o in outcomes:
            table.add_row(o.scenario, o.expected, str(o.crm_records), str(o.emails),
                          o.final_state, "[green]pass[/green]" if o.passed else "[red]FAIL[/red]",
                          o.note)
        out.print(table)
        for o in outcomes:
            for line in _case_lines(o):
                out.print(line, highlight=False, markup=False, soft_wrap=True)
        out.print(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed")
    if failed:
        raise typer.Exit(1)


def _case_lines(outcome: Any) -> list[str]:
    """One rehearsal case's record, queue entry and evidence, as the runbook asks to see."""
    lines = [f"{outcome.scenario} — {outcome.workflow_id or 'no item'}"]
    if outcome.record is not None:
        fields = ", ".join(f"{k}={v}" for k, v in sorted(outcome.record["fields"].items()))
        lines.append(f"  CRM record {outcome.record['id']}: {fields}")
    else:
        lines.append("  CRM record: none")
    entry = outcome.queue_entry
    if entry is not None:
        lines.append(f"  queue entry: {entry['reason']}, owner {entry['owner']}, escalates at "
                     f"{entry['escalate_at']}, {entry['status']}"
                     + (f" by {entry['resolved_by']}" if entry.get("resolved_by") else ""))
    else:
        lines.append("  queue entry: none")
    ids = outcome.evidence.get("audit_ids") or []
    if ids:
        lines.append(f"  evidence: audit entries {ids[0]}…{ids[-1]} ({len(ids)}): "
                     f"{outcome.evidence['command']}")
    if outcome.evidence.get("worker_logs"):
        lines.append(f"  worker logs: {outcome.evidence['worker_logs']}")
    return lines


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
    from inboxcrm.verify.check import MAX_IDS, CheckError, check_invariants, summary_rows

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
            return await check_invariants(
                conn, url, settled=settled, scope=scope, crm_id_property=crm_id_property,
                note_id_property=note_id_property)
        except CheckError as exc:
            fail(f"{exc} (--no-destination skips it)", 2)
            raise

    report = with_db(settings, run)
    if as_json:
        out.print_json(json.dumps(report.to_json()))
    else:
        table = Table(title="inboxcrm invariants" + (" (settled)" if settled else "")
                      + (f" — scope {scope}" if scope else ""))
        for column in ("check", "examined", "violations", "note"):
            table.add_column(column, overflow="fold")
        for name, examined, count, note in summary_rows(report):
            table.add_row(name, examined, count if count == "0" else f"[red]{count}[/red]",
                          note)
        out.print(table)
        out.print(report.destination_note)
        for result in report.results:
            for item in sorted(result.violations)[:MAX_IDS]:
                out.print(f"[red]violation[/red] {result.name}: {item}", highlight=False)
        out.print(f"{report.violations} violation(s); {len(report.in_flight)} in flight")
    if not report.ok:
        raise typer.Exit(1)


def _drift_json(report: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from inboxcrm.schemas.drift import DriftKind

    return {**asdict(report), "drift": report.drift,
            "counts": {kind.value: report.count(kind) for kind in DriftKind}}


def _print_drift(report: Any, title: str) -> None:
    from inboxcrm.schemas.drift import CHECKED_ACTIONS, DriftKind

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
    from inboxcrm.activities.drift import run_drift_check
    from inboxcrm.adapters.factory import ConfigurationError, build_crm, build_mail
    from inboxcrm.schemas.drift import DriftCheckRequest, DriftReport, Trigger
    from inboxcrm.store import drift

    settings = settings_from_env()
    now = datetime.now(UTC)
    start = parse_since(since, now) if since is not None else None

    async def check_now() -> Any:
        assert start is not None
        try:
            crm, mail = build_crm(settings), build_mail(settings)
        except ConfigurationError as exc:
            fail(str(exc), 2)
            raise
        pool = await db.create_pool(settings.database_url, max_size=2,
                                    role=role_of("operator", settings.db_role))
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
        return await drift.latest_report(conn, Trigger.SCHEDULE.value)

    progress("reading the latest scheduled drift report…")
    scheduled = with_db(settings, latest)
    if start is not None:
        progress(f"checking up to {sample or settings.drift_check_sample_size} operation(s) "
                 f"completed since {start.isoformat()} at the destinations…")
    on_demand = asyncio.run(check_now()) if start is not None else None
    if on_demand is not None:
        progress(f"checked {on_demand.sampled} of {on_demand.completed_in_window} operation(s)")
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


def chaos(
    events: Annotated[int, typer.Option(min=1, help="Distinct deliveries.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the event mix and of the faults.")] = 1,
    kills: Annotated[int, typer.Option(min=0, help="Worker kill -9s.")] = 3,
    workers: Annotated[int, typer.Option(
        min=1, help="Worker processes; the kills are spread over them.")] = 2,
    concurrency: Annotated[int, typer.Option(min=1, help="Posts in flight at once.")] = 20,
    rate: Annotated[float, typer.Option(help="Deliveries started per second.")] = 10.0,
    data_dir: Annotated[Path, typer.Option(help="The stack's own data directory.")] = Path(
        ".data/chaos"),
    keep_database: Annotated[bool, typer.Option(
        "--keep-database", help="Keep the run's database when a violation is found.")] = False,
    freeze: Annotated[float, typer.Option(
        min=0, help="Long-fault phase: seconds the store is frozen (SIGSTOP) with sends "
        "paused over the run; 0 turns it off.")] = 0.0,
    crm: Annotated[str, typer.Option(
        help="The CRM the tenant writes to, on the sandbox's surface of it: hubspot, "
        "salesforce or pipedrive.")] = "hubspot",
    salesforce_duplicate_rule: Annotated[str | None, typer.Option(
        help="With --crm salesforce: the org's duplicate rule, none, alert (the sandbox's "
        "default) or block.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Chaos run on a fresh stack of its own (free ports, fresh database): concurrent
    deliveries and redeliveries, sandbox faults, worker kill -9s, a relay restart, then
    operator resolution and the settled invariant check. Exit 1 on a violation, 2 if the run
    did not reach its targets (fault share, kills, restart, drained queue). Its phases are
    reported on stderr as they happen; stdout carries the table (or the JSON)."""
    from inboxcrm.stack.processes import StackError
    from inboxcrm.verify.chaos import CRMS, ChaosConfig, run_on_fresh_stack, summary_rows

    if crm not in CRMS:
        fail(f"unknown CRM {crm!r} (known: {', '.join(CRMS)})", 2)
        return
    if salesforce_duplicate_rule not in (None, "none", "alert", "block"):
        fail(f"unknown duplicate rule {salesforce_duplicate_rule!r} (none, alert, block)", 2)
        return
    config = ChaosConfig(events=events, seed=seed, kills=kills, workers=workers,
                         concurrency=concurrency,
                         rate=rate, deadline=max(1800.0, events * 3.0) + freeze * 2,
                         freeze_seconds=freeze, crm=crm,
                         salesforce_duplicate_rule=salesforce_duplicate_rule)
    try:
        result = run_on_fresh_stack(config, data_dir.resolve(), progress,
                                    keep_database=keep_database)
    except StackError as exc:
        fail(str(exc), 2)
        return
    if as_json:
        out.print_json(json.dumps({
            "events": events, "seed": seed, "crm": crm, "exit_code": result.exit_code,
            "summary": dict(summary_rows(result)), "notes": result.stats.notes,
            "violations": {r.name: sorted(r.violations) for r in result.report.results
                           if r.violations}}))
        raise typer.Exit(result.exit_code)
    table = Table(title=f"inboxcrm chaos (events {events}, seed {seed}, crm {crm})")
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
