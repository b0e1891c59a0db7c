"""`inboxcrm` command line (docs/architecture.md §10), assembled from one module per group:
`stack`, `items`, `review`, `verify`, `extract`, `report`. Commands are registered here, in
the order `inboxcrm --help` lists them."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from inboxcrm.cli import (
    calibrate,
    extract,
    golive,
    items,
    keys,
    recover,
    report,
    review,
    reviewer,
    stack,
    templates,
    verify,
)
from inboxcrm.cli.contact import contact_app
from inboxcrm.cli.crm import crm_app
from inboxcrm.cli.mailbox import mailbox_app

# typer's own `--install-completion` / `--show-completion` (bash, zsh, fish, PowerShell).
app = typer.Typer(add_completion=True, no_args_is_help=True,
                  help="inboxcrm: inbound email to CRM contacts and follow-ups, no duplicates.")


def version() -> str:
    """The installed distribution's version (setuptools-scm, from the git tag)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("inboxcrm")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"inboxcrm {version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option(
        "--version", help="Print the version and exit.", is_eager=True,
        callback=_print_version)] = False,
) -> None:
    """inboxcrm: inbound email to CRM contacts and follow-ups, no duplicates."""
app.add_typer(review.review_app, name="review")
app.add_typer(reviewer.reviewer_app, name="reviewer")
app.add_typer(templates.template_app, name="template")
app.add_typer(mailbox_app, name="mailbox")
app.add_typer(crm_app, name="crm")
app.add_typer(contact_app, name="contact")
app.add_typer(report.report_app, name="report")
app.add_typer(keys.keys_app, name="keys")

app.command()(stack.up)
app.command()(items.status)
app.command()(extract.extract)
app.command("send-test")(extract.send_test)
app.command()(calibrate.calibrate)
app.command()(items.queue)
app.command()(items.pause)
app.command()(items.resume)
app.command()(items.audit)
app.command()(items.replay)
app.command()(recover.recover)
app.command()(items.purge)
app.command()(items.forget)
app.command()(items.export)
app.command()(verify.rehearse)
app.command()(verify.check)
app.command()(verify.reconcile)
app.command()(verify.chaos)
app.command("hubspot-setup")(stack.hubspot_setup)
golive.register(app)  # mode, shadow report


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


