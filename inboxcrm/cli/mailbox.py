"""`inboxcrm mailbox add imap|gmail|list|sync|remove` (docs/architecture.md §10, docs/mailboxes.md):
register a tenant's mailbox folders and run one watcher per folder, the Temporal workflow
`mailbox/{tenant}/{kind}/{address}/{folder}`. The registration stores the *name* of the
variable holding the password or OAuth token; the workers read its value when they connect."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from datetime import timedelta
from typing import Annotated, Any

import typer
from pydantic_settings import BaseSettings, SettingsConfigDict
from rich.table import Table
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError

from inboxcrm.cli.common import err, fail, out, settings_from_env, with_db
from inboxcrm.cli.mailbox_graph import (
    GRAPH_KIND,
    graph_cursor,
    register_graph,
    start_graph_watcher,
)
from inboxcrm.domain.policy import PolicyError, UnknownTenant, get_policy
from inboxcrm.platform import temporal
from inboxcrm.platform.config import Settings
from inboxcrm.platform.gmail_config import GmailSettings
from inboxcrm.schemas.mailboxes import (
    GMAIL_WATCH_WORKFLOW_TYPE,
    MAILBOX_WATCH_WORKFLOW_TYPE,
    SYNC_UPDATE,
    MailboxWatch,
    WatchSummary,
    mailbox_workflow_id,
)
from inboxcrm.store import gmail, mailboxes, subscriptions

mailbox_app = typer.Typer(no_args_is_help=True,
                          help="Mailboxes watched where the mail lives (IMAP, Gmail API, "
                          "Microsoft Graph).")
add_app = typer.Typer(no_args_is_help=True, help="Register a mailbox and start its watchers.")
mailbox_app.add_typer(add_app, name="add")

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# How long `remove` waits for a Gmail or Graph watcher to stop its watch or delete its
# subscription and end.
REMOVE_WAIT_SECONDS = 30.0
FOLDER = re.compile(r"^[\x20-\x7e]{1,200}$")  # IMAP names are modified UTF-7: ASCII


class WatchRhythm(BaseSettings):
    """How the watchers started by this command pace themselves (`INBOXCRM_IMAP_*`)."""

    model_config = SettingsConfigDict(env_prefix="INBOXCRM_IMAP_", extra="ignore")
    heartbeat_seconds: float = 20.0
    session_seconds: float = 1800.0
    idle_seconds: float = 300.0
    history_events_limit: int = 2000


TenantOpt = Annotated[str, typer.Option("--tenant", help="The tenant that owns the mailbox.")]
AddressOpt = Annotated[str, typer.Option(
    "--address", help="The mailbox's address: one of the tenant's mailboxes in its policy.")]


def _watch(tenant: str, kind: str, address: str, folder: str) -> MailboxWatch:
    rhythm = WatchRhythm()
    return MailboxWatch(tenant=tenant, kind=kind, address=address, folder=folder,
                        heartbeat_seconds=rhythm.heartbeat_seconds,
                        session_seconds=rhythm.session_seconds,
                        # Gmail: the catch-up without a push (INBOXCRM_GMAIL_POLL_SECONDS).
                        idle_seconds=GmailSettings().poll_seconds if kind == gmail.KIND
                        else rhythm.idle_seconds,
                        history_events_limit=rhythm.history_events_limit)


async def _start_watcher(client: Client, settings: Settings, watch: MailboxWatch) -> str:
    """Start the folder's watcher unless it runs (one per folder, whoever asks)."""
    workflow_id = mailbox_workflow_id(watch.tenant, watch.kind, watch.address, watch.folder)
    if watch.kind == GRAPH_KIND:
        return await start_graph_watcher(client, settings, watch.tenant, watch.address)
    workflow_type = GMAIL_WATCH_WORKFLOW_TYPE if watch.kind == gmail.KIND \
        else MAILBOX_WATCH_WORKFLOW_TYPE
    await client.start_workflow(
        workflow_type, watch, id=workflow_id, task_queue=settings.task_queue,
        static_summary=f"mailbox watcher · tenant {watch.tenant} · {watch.kind}",
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        # A folder removed and added again gets a watcher again.
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE)
    return workflow_id


def _own_address(tenant: str, address: str) -> str:
    try:
        policy = get_policy(tenant)
    except (UnknownTenant, PolicyError) as exc:
        fail(f"unknown tenant {tenant!r} ({type(exc).__name__})")
        raise
    if not policy.is_own_mailbox(address):
        fail(f"{address!r} is not one of tenant {tenant!r}'s mailboxes (its policy lists "
             f"{', '.join(policy.mailboxes) or 'none'})")
    return address.strip().lower()


@add_app.command("imap")
def add_imap(
    tenant: TenantOpt, address: AddressOpt,
    host: Annotated[str, typer.Option("--host", help="IMAP server host.")],
    port: Annotated[int, typer.Option("--port", help="IMAP server port (993 for TLS).")],
    tls: Annotated[str, typer.Option("--tls", help="none | starttls | tls "
                                     "(none only with INBOXCRM_ENV=local).")],
    username: Annotated[str, typer.Option("--username", help="The login name.")],
    password_env: Annotated[str | None, typer.Option(
        "--password-env", help="The variable the workers read the password from.")] = None,
    oauth_token_env: Annotated[str | None, typer.Option(
        "--oauth-token-env", help="The variable the workers read an OAuth 2.0 access token "
                                  "from (SASL XOAUTH2).")] = None,
    folder: Annotated[list[str] | None, typer.Option(
        "--folder", help="A folder to watch (repeat; default INBOX).")] = None,
    max_connections: Annotated[int, typer.Option(
        "--max-connections", help="Connections to the account at most, all workers "
                                  "together.")] = 2,
    after_store: Annotated[str, typer.Option(
        "--after-store", help="none (read-only, the default) | seen | move:FOLDER: done to "
                              "each message once it is stored.")] = "none",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Register an IMAP mailbox and start one watcher per folder."""
    settings = settings_from_env()
    address = _own_address(tenant, address)
    if tls not in ("none", "starttls", "tls"):
        fail("--tls is none, starttls or tls")
    if tls == "none" and settings.env != "local":
        fail("--tls none sends the password in clear: only with INBOXCRM_ENV=local")
    if (password_env is None) == (oauth_token_env is None):
        fail("give exactly one of --password-env and --oauth-token-env")
    variable = password_env or oauth_token_env or ""
    if not ENV_NAME.match(variable):
        fail("the credential option names an environment variable (letters, digits, _), "
             "not the secret itself")
    if not 1 <= port <= 65535:
        fail("--port is 1-65535")
    if not 1 <= max_connections <= 20:
        fail("--max-connections is 1-20")
    if after_store not in ("none", "seen") and not (
            after_store.startswith("move:") and FOLDER.match(after_store[5:])):
        fail("--after-store is none, seen or move:FOLDER")
    folders = list(dict.fromkeys(folder or ["INBOX"]))
    if after_store[5:] in folders:
        fail("--after-store move: names a folder that is watched")
    for name in folders:
        if not FOLDER.match(name):
            fail(f"folder {name!r}: printable ASCII (IMAP's modified UTF-7 name), at most 200")

    async def register(conn: Any) -> list[str]:
        refused: list[str] = []
        async with conn.transaction():
            for name in folders:
                if not await mailboxes.add_mailbox(
                        conn, tenant=tenant, kind="imap", address=address, folder=name,
                        host=host, port=port, tls=tls, username=username,
                        password_env=password_env, oauth_token_env=oauth_token_env,
                        max_connections=max_connections, after_store=after_store):
                    refused.append(name)
            if refused:
                raise _AlreadyWatched(refused)
        return folders

    try:
        with_db(settings, register)
    except _AlreadyWatched as exc:
        fail(f"already watched: {', '.join(exc.folders)} of {address} (tenant {tenant}); "
             "nothing was added")

    async def start() -> list[str]:
        client = await temporal.connect(settings, tenant=tenant)  # its namespace
        return [await _start_watcher(client, settings, _watch(tenant, "imap", address, name))
                for name in folders]

    watchers = asyncio.run(start())
    if as_json:
        out.print_json(json.dumps({"tenant": tenant, "address": address, "kind": "imap",
                                   "folders": folders, "watchers": watchers}))
        return
    for workflow_id in watchers:
        out.print(f"watching: {workflow_id}", highlight=False)


register_graph(add_app, lambda tenant, address: _own_address(tenant, address))


class _AlreadyWatched(Exception):
    def __init__(self, folders: list[str]) -> None:
        super().__init__("already watched")
        self.folders = folders


TOPIC = re.compile(r"^projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/topics/[A-Za-z][\w.~+%-]{2,254}$")


@add_app.command("gmail")
def add_gmail(
    tenant: TenantOpt, address: AddressOpt,
    oauth_token_env: Annotated[str, typer.Option(
        "--oauth-token-env", help="The variable the workers read the mailbox's OAuth 2.0 "
                                  "access token from (scope gmail.readonly).")],
    topic: Annotated[str | None, typer.Option(
        "--topic", help="The Pub/Sub topic users.watch publishes to "
                        "(projects/P/topics/T; default INBOXCRM_GMAIL_TOPIC).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Register a Gmail mailbox (Gmail API, Pub/Sub push) and start its watcher."""
    settings = settings_from_env()
    address = _own_address(tenant, address)
    if not ENV_NAME.match(oauth_token_env):
        fail("--oauth-token-env names an environment variable (letters, digits, _), "
             "not the token itself")
    topic = topic or GmailSettings().topic
    if not topic or not TOPIC.match(topic):
        fail("--topic (or INBOXCRM_GMAIL_TOPIC) is the Pub/Sub topic, "
             "projects/PROJECT/topics/TOPIC")
    assert topic is not None

    async def register(conn: Any) -> bool:
        return await gmail.add_gmail_mailbox(conn, tenant=tenant, address=address,
                                             oauth_token_env=oauth_token_env,
                                             push_topic=topic)

    if not with_db(settings, register):
        fail(f"already watched: {address} (tenant {tenant}, gmail); nothing was added")

    async def start() -> str:
        client = await temporal.connect(settings, tenant=tenant)  # its namespace
        return await _start_watcher(client, settings,
                                    _watch(tenant, gmail.KIND, address, gmail.FOLDER))

    watcher = asyncio.run(start())
    if as_json:
        out.print_json(json.dumps({"tenant": tenant, "address": address, "kind": "gmail",
                                   "folders": [gmail.FOLDER], "watchers": [watcher]}))
        return
    out.print(f"watching: {watcher}", highlight=False)


@mailbox_app.command("list")
def list_(tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")
                            ] = None,
          as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """The watched folders with their state and cursor."""
    settings = settings_from_env()

    async def load(conn: Any) -> list[dict[str, Any]]:
        rows = await mailboxes.list_mailboxes(conn, tenant=tenant)
        running = await _running(settings, rows)
        found = []
        for row in rows:
            state = row["state"]
            key = mailbox_workflow_id(row["tenant"], row["kind"], row["address"], row["folder"])
            if running is not None and not running.get(key, False):
                state = "stopped"
            cursor = await graph_cursor(conn, row) if row["kind"] == GRAPH_KIND \
                else None if row["uidvalidity"] is None else {
                "uidvalidity": int(row["uidvalidity"]), "highest_uid": int(row["highest_uid"]),
                "highest_modseq": None if row["highest_modseq"] is None
                else int(row["highest_modseq"])}
            if row["kind"] == gmail.KIND:
                cursor = await _gmail_cursor(conn, row)
            found.append({
                "tenant": row["tenant"], "address": row["address"], "kind": row["kind"],
                "folder": row["folder"], "state": state, "cursor": cursor,
                "last_stored_at": row["last_stored_at"].isoformat()
                if row["last_stored_at"] else None,
                "last_checked_at": row["last_checked_at"].isoformat()
                if row["last_checked_at"] else None,
                "last_error": row["last_error"], "max_connections": row["max_connections"]})
        return found

    found = with_db(settings, load)
    if as_json:
        out.print_json(json.dumps(found))
        return
    table = Table(title=f"mailboxes ({len(found)} folders)")
    for column in ("tenant", "address", "kind", "folder", "state", "cursor", "last stored",
                   "last checked"):
        table.add_column(column)
    for item in found:
        cursor = item["cursor"]
        table.add_row(item["tenant"], item["address"], item["kind"], item["folder"],
                      item["state"] + (f" ({item['last_error']})" if item["last_error"]
                                       and item["state"] == "error" else ""),
                      _cursor_text(cursor),
                      (item["last_stored_at"] or "-")[:19],
                      (item["last_checked_at"] or "-")[:19])
    out.print(table)


def _cursor_text(cursor: dict[str, Any] | None) -> str:
    """A folder's cursor in the table: IMAP's UIDVALIDITY:UID, Gmail's history ID, or that
    Graph keeps a delta link."""
    if not cursor:
        return "-"
    if "history_id" in cursor:
        return f"history {cursor['history_id']}"
    if "uidvalidity" in cursor:
        return f"{cursor['uidvalidity']}:{cursor['highest_uid']}"
    return "delta"


async def _gmail_cursor(conn: Any, row: Any) -> dict[str, Any] | None:
    """A Gmail mailbox's cursor: its historyId and when its watch lapses."""
    sub = await subscriptions.get_subscription(conn, tenant=row["tenant"], kind=gmail.KIND,
                                               address=row["address"], folder=row["folder"])
    if sub is None:
        return None
    return {"history_id": sub["cursor"],
            "watch_expires_at": sub["expires_at"].isoformat() if sub["expires_at"] else None}


async def _running(settings: Settings, rows: list[Any]) -> dict[str, bool] | None:
    """Whether each folder's watcher runs; None when Temporal cannot be asked."""
    try:
        client = await asyncio.wait_for(temporal.connect(settings), 5)
    except Exception:  # noqa: BLE001 - list what the store knows
        err.print("[yellow]warning:[/yellow] Temporal unreachable: states as last recorded")
        return None
    running: dict[str, bool] = {}
    for row in rows:
        key = mailbox_workflow_id(row["tenant"], row["kind"], row["address"], row["folder"])
        try:
            # The watcher runs in its tenant's namespace (docs/architecture.md §7).
            described = await temporal.in_namespace(
                client, temporal.namespace_for(settings, row["tenant"])
            ).get_workflow_handle(key).describe(rpc_timeout=timedelta(seconds=5))
            running[key] = described.status == WorkflowExecutionStatus.RUNNING
        except RPCError:
            running[key] = False
    return running


@mailbox_app.command("sync")
def sync(tenant: TenantOpt, address: AddressOpt,
         as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """One catch-up of every folder of the mailbox now, by its watchers."""
    settings = settings_from_env()
    address = address.strip().lower()

    async def folders(conn: Any) -> list[Any]:
        return await mailboxes.mailbox_folders(conn, tenant=tenant, address=address)

    rows = with_db(settings, folders)
    if not rows:
        fail(f"no mailbox {address} registered for tenant {tenant}")

    async def run() -> WatchSummary:
        client = await temporal.connect(settings, tenant=tenant)  # its namespace
        total = WatchSummary()
        for row in rows:
            workflow_id = await _start_watcher(
                client, settings, _watch(tenant, row["kind"], address, row["folder"]))
            summary = await client.get_workflow_handle(workflow_id).execute_update(
                SYNC_UPDATE, result_type=WatchSummary)
            total.add(summary)
        return total

    try:
        total = asyncio.run(run())
    except WorkflowUpdateFailedError as exc:
        fail(str(exc.cause or exc))
        raise
    answer = {"stored": total.stored, "duplicates": total.duplicates + total.reseen,
              "copies": total.copies}
    if as_json:
        out.print_json(json.dumps(answer))
        return
    out.print(f"stored {answer['stored']}, duplicates {answer['duplicates']}, "
              f"copies {answer['copies']}", highlight=False)


async def _wait_closed(handle: WorkflowHandle[Any, Any]) -> None:
    """Until the cancelled watcher has undone its registration at the provider's end
    (Gmail: `users.stop`; Graph: the subscription deleted) and ended, so a mailbox added
    again at once gets a new watcher, not the closing one."""
    with contextlib.suppress(WorkflowFailureError, RPCError, TimeoutError):
        await asyncio.wait_for(handle.result(), REMOVE_WAIT_SECONDS)


@mailbox_app.command("remove")
def remove(tenant: TenantOpt, address: AddressOpt,
           as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False
           ) -> None:
    """Stop the mailbox's watchers and unregister it (what it stored stays stored); a Gmail
    watch is stopped and a Graph subscription deleted at the provider's end."""
    settings = settings_from_env()
    address = address.strip().lower()

    async def folders(conn: Any) -> list[Any]:
        return await mailboxes.mailbox_folders(conn, tenant=tenant, address=address)

    async def delete(conn: Any) -> list[Any]:
        return await mailboxes.remove_mailbox(conn, tenant=tenant, address=address)

    rows = with_db(settings, folders)
    if not rows:
        fail(f"no mailbox {address} registered for tenant {tenant}")

    async def stop() -> None:
        client = await temporal.connect(settings, tenant=tenant)  # its namespace
        for row in rows:
            handle = client.get_workflow_handle(
                mailbox_workflow_id(tenant, row["kind"], address, row["folder"]))
            with contextlib.suppress(RPCError):  # not running: nothing to stop
                await handle.cancel()
                if row["kind"] in (GRAPH_KIND, gmail.KIND):
                    await _wait_closed(handle)

    # The watchers first: a Gmail watcher's `users.stop` reads the token's variable from the
    # registration. One that has not closed within REMOVE_WAIT_SECONDS (no worker running)
    # finds the registration gone when it does, and leaves its watch to lapse.
    asyncio.run(stop())
    rows = with_db(settings, delete)
    removed = [str(r["folder"]) for r in rows]
    if as_json:
        out.print_json(json.dumps({"tenant": tenant, "address": address, "removed": removed}))
        return
    out.print(f"removed {address} ({', '.join(removed)})", highlight=False)
