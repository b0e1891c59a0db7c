"""The mailbox watchers' histories, live on the stack: one run of each watcher (Gmail,
Microsoft Graph, IMAP) that caught up, was woken by a push or notification and read a
message, renewed its watch or subscription where the source has one, answered a `sync`,
and was cancelled by `inboxcrm mailbox remove`. Each history replays against its own
workflow class; with `INBOXCRM_CAPTURE_HISTORIES=<label>` it is stored as
`tests/histories/watchers/<label>-<kind>-removed.json`, which
`tests/fast/test_replay_stored.py` replays in the fast tier from then on (CONTRIBUTING.md,
"Changing workflow code safely")."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory
from temporalio.worker import Replayer

from inboxcrm.platform.config import Settings
from inboxcrm.schemas.mailboxes import mailbox_workflow_id
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient
from inboxcrm.workflows.mailbox_gmail import GmailWatchWorkflow
from inboxcrm.workflows.mailbox_graph import GraphMailboxWorkflow
from inboxcrm.workflows.mailbox_watch import MailboxWatchWorkflow
from tests.helpers import dovecot as dovecot_helper
from tests.helpers.dovecot import Dovecot
from tests.helpers.histories import store_history
from tests.test_mailbox_gmail import ADDRESS, GmailBox
from tests.test_mailbox_gmail import wait_items as gmail_items
from tests.test_mailbox_graph import GraphMailbox, watching
from tests.test_mailbox_graph import wait_items as graph_items
from tests.test_mailbox_imap import OAUTH_TOKEN, OAUTH_USER, PASSWORD, USER, Mailbox
from tests.test_mailbox_imap import wait_items_done as imap_items

CLOSE_SECONDS = 60.0


async def _closed_history(client: Client, workflow_id: str) -> WorkflowHistory:
    """The watcher's history once `mailbox remove` has cancelled it and it has closed."""
    handle = client.get_workflow_handle(workflow_id)
    with pytest.raises(WorkflowFailureError):  # cancelled
        await asyncio.wait_for(handle.result(), CLOSE_SECONDS)
    return await handle.fetch_history()


async def _replay_and_keep(history: WorkflowHistory, workflow: type, client: Client,
                           name: str, settings: Settings) -> None:
    replayer = Replayer(workflows=[workflow], data_converter=client.data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
    label = os.environ.get("INBOXCRM_CAPTURE_HISTORIES")
    if label:
        store_history(history, f"watchers/{label}-{name}", settings)


def _has(history: WorkflowHistory, event_type: str) -> bool:
    return any(e.WhichOneof("attributes") == event_type for e in history.events)


async def _gmail_cursor(db: asyncpg.Pool) -> object:
    return await db.fetchval("SELECT cursor FROM mailbox_subscriptions WHERE kind = 'gmail'"
                             " AND address = $1", ADDRESS)


@pytest.fixture
async def gmail_box(stack: Stack) -> AsyncIterator[GmailBox]:
    box = GmailBox(stack)
    await box.prepare()
    yield box
    box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    box.worker.stop_all()
    await box.sandbox.aclose()


async def test_gmail_watcher_history(env: StackClient, db: asyncpg.Pool, gmail_box: GmailBox,
                                     app_settings: Settings) -> None:
    box = gmail_box
    box.worker.start()
    box.add()
    await env.wait_for(lambda: _gmail_cursor(db), timeout=60, what="the first catch-up")
    [pushed] = await box.deliver(1)  # the watcher is woken by the push and reads it
    assert pushed["push_status"] == 200
    await gmail_items(env, db, box, 1)
    calls = (await box.state())["watch"]["calls"]
    await db.execute("UPDATE mailbox_subscriptions SET expires_at = now() + interval '2 hours'"
                     " WHERE kind = 'gmail' AND address = $1", ADDRESS)
    synced = box.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS, "--json")
    assert synced.returncode == 0, synced.stderr
    assert (await box.state())["watch"]["calls"] == calls + 1  # renewed
    removed = box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    assert removed.returncode == 0, removed.stderr
    client = await env.temporal()
    history = await _closed_history(
        client, mailbox_workflow_id("acme", "gmail", ADDRESS, "INBOX"))
    assert [s["had_watch"] for s in (await box.state())["stops"]] == [True]  # users.stop
    assert _has(history, "workflow_execution_signaled_event_attributes")
    assert _has(history, "workflow_execution_update_accepted_event_attributes")
    await _replay_and_keep(history, GmailWatchWorkflow, client, "gmail-removed", app_settings)


@pytest.fixture
async def graph_box(stack: Stack) -> AsyncIterator[GraphMailbox]:
    box = GraphMailbox(stack)
    box.worker.start()
    yield box
    box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    box.worker.stop_all()
    await box.http.aclose()


async def test_graph_watcher_history(env: StackClient, db: asyncpg.Pool,
                                     graph_box: GraphMailbox, app_settings: Settings) -> None:
    box = graph_box
    box.add()
    sub = await watching(env, box)
    sent = await box.deliver(notify=1)
    await graph_items(env, db, [sent["id"]])
    await asyncio.sleep(1.1)  # a renewal moves the expiry by at least a second
    assert (await box.lifecycle("reauthorizationRequired"))["notifications"] == [202]

    async def renewed() -> bool:
        subs = await box.subscriptions()
        return (len(subs) == 1 and not subs[0]["reauthorize"]
                and subs[0]["expirationDateTime"] != sub["expirationDateTime"])

    await env.wait_for(renewed, timeout=60, what="the subscription renewed")
    synced = box.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS, "--json")
    assert synced.returncode == 0, synced.stderr
    removed = box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    assert removed.returncode == 0, removed.stderr
    client = await env.temporal()
    history = await _closed_history(
        client, mailbox_workflow_id("acme", "graph", ADDRESS, "inbox"))
    assert await box.subscriptions() == []  # deleted on the way out
    await _replay_and_keep(history, GraphMailboxWorkflow, client, "graph-removed",
                           app_settings)


@pytest.fixture(scope="module")
def dovecot() -> Iterator[Dovecot]:
    if not dovecot_helper.available():
        pytest.skip(dovecot_helper.MISSING)
    root = Path(tempfile.mkdtemp(prefix="inboxcrm-dovecot-"))
    server = Dovecot(root, idle_notify_seconds=900).start(
        {USER: PASSWORD, OAUTH_USER: OAUTH_TOKEN})
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def imap_box(stack: Stack, dovecot: Dovecot) -> AsyncIterator[Mailbox]:
    box = Mailbox(stack, dovecot)
    yield box
    box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    box.worker.stop_all()


async def test_imap_watcher_history(env: StackClient, db: asyncpg.Pool, imap_box: Mailbox,
                                    app_settings: Settings) -> None:
    box = imap_box
    box.deliver(1)  # waiting before anything watched: the first catch-up
    box.worker.start()
    box.add()
    await imap_items(env, db, box.folder, 1)
    box.deliver(1)  # seen in IDLE
    await imap_items(env, db, box.folder, 2)
    synced = box.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS, "--json")
    assert synced.returncode == 0, synced.stderr
    removed = box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    assert removed.returncode == 0, removed.stderr
    client = await env.temporal()
    history = await _closed_history(
        client, mailbox_workflow_id("acme", "imap", ADDRESS, box.folder))
    await _replay_and_keep(history, MailboxWatchWorkflow, client, "imap-removed",
                           app_settings)
