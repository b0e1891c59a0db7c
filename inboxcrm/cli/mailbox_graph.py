"""`inboxcrm mailbox add graph` (docs/mailboxes.md, "Microsoft 365 (Graph)"): register a
tenant's Microsoft 365 mailbox and start its watcher, the Temporal workflow
`mailbox/{tenant}/graph/{address}/inbox`. The registration stores the *name* of the variable
holding the Graph access token (`Mail.Read`); the workers read its value at each call.
`list`, `sync` and `remove` are the commands of inboxcrm/cli/mailbox.py, for every kind."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Annotated, Any

import typer
from pydantic_settings import BaseSettings, SettingsConfigDict
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from inboxcrm.cli.common import fail, out, settings_from_env, with_db
from inboxcrm.platform import temporal
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.graph_mailbox import GRAPH_FOLDER, GRAPH_KIND, GraphWatch
from inboxcrm.schemas.mailboxes import mailbox_workflow_id
from inboxcrm.store import mailboxes, subscriptions
from inboxcrm.workflows.mailbox_graph import GraphMailboxWorkflow

__all__ = ["GRAPH_KIND", "graph_cursor", "register_graph", "start_graph_watcher"]

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class GraphRhythm(BaseSettings):
    """How the Graph watchers started by this command pace themselves (`INBOXCRM_GRAPH_*`)."""

    model_config = SettingsConfigDict(env_prefix="INBOXCRM_GRAPH_", extra="ignore")
    heartbeat_seconds: float = 20.0
    poll_seconds: float = 300.0
    subscription_seconds: float = 3 * 86_400.0
    renew_ahead_seconds: float = 36 * 3600.0
    history_events_limit: int = 2000


def graph_watch(tenant: str, address: str) -> GraphWatch:
    rhythm = GraphRhythm()
    return GraphWatch(tenant=tenant, address=address, folder=GRAPH_FOLDER,
                      heartbeat_seconds=rhythm.heartbeat_seconds,
                      poll_seconds=rhythm.poll_seconds,
                      subscription_seconds=rhythm.subscription_seconds,
                      renew_ahead_seconds=rhythm.renew_ahead_seconds,
                      history_events_limit=rhythm.history_events_limit)


async def start_graph_watcher(client: Client, settings: Settings, tenant: str,
                              address: str) -> str:
    """Start the mailbox's Graph watcher unless it runs (one per mailbox, whoever asks)."""
    workflow_id = mailbox_workflow_id(tenant, GRAPH_KIND, address, GRAPH_FOLDER)
    await client.start_workflow(
        GraphMailboxWorkflow.run, graph_watch(tenant, address), id=workflow_id,
        task_queue=settings.task_queue,
        static_summary=f"mailbox watcher · tenant {tenant} · graph",
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE)
    return workflow_id


async def graph_cursor(conn: Any, row: Any) -> dict[str, Any] | None:
    """What `mailbox list` shows of a Graph mailbox's cursor: whether a delta link is
    stored, and the subscription's expiry (never the link or any secret)."""
    sub = await subscriptions.get_subscription(conn, tenant=row["tenant"], kind=GRAPH_KIND,
                                               address=row["address"], folder=row["folder"])
    if sub is None:
        return None
    return {"delta": sub["cursor"] is not None,
            "subscription_expires_at": sub["expires_at"].isoformat()
            if sub["expires_at"] else None}


def register_graph(add_app: typer.Typer, own_address: Callable[[str, str], str]) -> None:
    """Add `mailbox add graph` to the `add` group."""

    @add_app.command("graph")
    def add_graph(
        tenant: Annotated[str, typer.Option("--tenant", help="The tenant that owns the mailbox.")],
        address: Annotated[str, typer.Option(
            "--address", help="The mailbox's address: one of the tenant's mailboxes in its "
                              "policy (its Microsoft 365 user principal name).")],
        oauth_token_env: Annotated[str, typer.Option(
            "--oauth-token-env", help="The variable the workers read a Graph access token "
                                      "(Mail.Read) from.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Register a Microsoft 365 mailbox (Graph) and start its watcher."""
        settings = settings_from_env()
        address = own_address(tenant, address)
        if not ENV_NAME.match(oauth_token_env):
            fail("--oauth-token-env names an environment variable (letters, digits, _), "
                 "not the token itself")

        async def register(conn: Any) -> bool:
            return await mailboxes.add_mailbox(
                conn, tenant=tenant, kind=GRAPH_KIND, address=address, folder=GRAPH_FOLDER,
                host=None, port=None, tls=None, username=None, password_env=None,
                oauth_token_env=oauth_token_env, max_connections=1)

        if not with_db(settings, register):
            fail(f"already watched: {address} (tenant {tenant}) over Graph; nothing was added")

        async def start() -> str:
            client = await temporal.connect(settings, tenant=tenant)  # its namespace
            return await start_graph_watcher(client, settings, tenant, address)

        watcher = asyncio.run(start())
        if as_json:
            out.print_json(json.dumps({"tenant": tenant, "address": address, "kind": GRAPH_KIND,
                                       "folders": [GRAPH_FOLDER], "watchers": [watcher]}))
            return
        out.print(f"watching: {watcher}", highlight=False)
