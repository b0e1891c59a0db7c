"""Microsoft Graph mailbox source against the sandbox's Graph subset (inboxcrm/sandbox/
graph.py), the stack's relay and a worker of the test's own, counted in the ledger
(`inbound_events`, source `graph`):

- the validation handshake is answered (the sandbox refuses a subscription otherwise);
- a notification with a wrong clientState, or for an unknown subscription, is refused and
  stores nothing;
- each message notified is one item, and the same notification twice is still one;
- mail Graph never notified (a gap) is caught up by the delta query after `missed`, with
  no duplicate and nothing lost; mail that arrived before the mailbox was added is caught up
  on start; `subscriptionRemoved` → a new subscription and a catch-up;
  `reauthorizationRequired` → renewed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.worker import Replayer

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from inboxcrm.workflows.mailbox_graph import GraphMailboxWorkflow
from tests.helpers.own_worker import OwnWorker

ADDRESS = "sales@acme.test"
TOKEN_ENV = "INBOXCRM_TEST_GRAPH_TOKEN"
# No polling in these tests: only a notification or a lifecycle event makes the watcher
# read, so a gap stays a gap until `missed` says so.
RHYTHM = {"INBOXCRM_GRAPH_POLL_SECONDS": "3600", "INBOXCRM_GRAPH_HEARTBEAT_SECONDS": "5"}


class GraphMailbox:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.worker = OwnWorker(
            stack, **{TOKEN_ENV: "graph-test-access-token",
                      "INBOXCRM_GRAPH_URL": stack.sandbox_url,
                      "INBOXCRM_GRAPH_NOTIFICATION_URL": f"{stack.relay_url}/v1/inbound/graph"},
            **RHYTHM)
        self.http = httpx.AsyncClient(timeout=30)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(self.stack.env, INBOXCRM_TASK_QUEUE=self.worker.task_queue, **RHYTHM)
        return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    def add(self) -> None:
        done = self.cli("mailbox", "add", "graph", "--tenant", "acme", "--address", ADDRESS,
                        "--oauth-token-env", TOKEN_ENV)
        assert done.returncode == 0, done.stderr

    async def deliver(self, notify: int = 1) -> dict[str, Any]:
        raw = message_from(unique_email("graph"))
        answer = await self.http.post(f"{self.stack.sandbox_url}/_sandbox/graph/deliver",
                                      json={"mailbox": ADDRESS, "mime": raw, "notify": notify})
        answer.raise_for_status()
        return dict(answer.json())

    async def lifecycle(self, event: str) -> dict[str, Any]:
        answer = await self.http.post(f"{self.stack.sandbox_url}/_sandbox/graph/lifecycle",
                                      json={"mailbox": ADDRESS, "event": event})
        answer.raise_for_status()
        return dict(answer.json())

    async def subscriptions(self) -> list[dict[str, Any]]:
        answer = await self.http.get(f"{self.stack.sandbox_url}/_sandbox/graph/state")
        answer.raise_for_status()
        return [s for s in answer.json()["subscriptions"] if s["mailbox"] == ADDRESS]


@pytest.fixture
async def graph(stack: Stack) -> AsyncIterator[GraphMailbox]:
    box = GraphMailbox(stack)
    box.worker.start()
    yield box
    box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    # The watcher deletes its subscription at Graph's end once it is removed.
    for _ in range(300):
        if not await box.subscriptions():
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the removed mailbox's subscription was not deleted")
    box.worker.stop_all()
    await box.http.aclose()


async def items(db: asyncpg.Pool, ids: list[str]) -> list[asyncpg.Record]:
    return list(await db.fetch(
        "SELECT delivery_id, workflow_id FROM inbound_events WHERE tenant = 'acme'"
        " AND source = 'graph' AND mailbox = $1 AND delivery_id = ANY($2)", ADDRESS, ids))


async def wait_items(env: StackClient, db: asyncpg.Pool, ids: list[str],
                     timeout: float = 60) -> list[asyncpg.Record]:
    async def enough() -> list[asyncpg.Record] | None:
        rows = await items(db, ids)
        return rows if len(rows) >= len(ids) else None

    rows: list[asyncpg.Record] = await env.wait_for(enough, timeout=timeout,
                                                    what=f"{len(ids)} graph items")
    return rows


async def watching(env: StackClient, graph: GraphMailbox) -> dict[str, Any]:
    """The subscription, once the watcher's first catch-up (delta) has finished."""
    async def one() -> list[dict[str, Any]] | None:
        subs = await graph.subscriptions()
        checked = await env.db.fetchval(
            "SELECT last_checked_at FROM mailboxes WHERE tenant = 'acme' AND kind = 'graph'"
            " AND address = $1", ADDRESS)
        return subs if len(subs) == 1 and checked is not None else None

    found: list[dict[str, Any]] = await env.wait_for(one, timeout=60,
                                                     what="one graph subscription")
    return found[0]


async def test_validation_handshake_is_answered_as_text(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(f"{stack.relay_url}/v1/inbound/graph",
                                 params={"validationToken": "Validation: Testing <b>&"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    assert answer.text == "Validation: Testing <b>&"


async def test_forged_notifications_are_refused_and_store_nothing(
        env: StackClient, db: asyncpg.Pool, graph: GraphMailbox) -> None:
    graph.add()
    # The sandbox created the subscription only after the relay echoed its validationToken.
    sub = await watching(env, graph)
    assert sub["notificationUrl"].endswith("/v1/inbound/graph")
    message = await graph.deliver(notify=0)

    def forged(subscription_id: str, client_state: str) -> dict[str, Any]:
        path = f"Users/{ADDRESS}/Messages/{message['id']}"
        return {"value": [{"subscriptionId": subscription_id, "changeType": "created",
                           "clientState": client_state, "resource": path,
                           "resourceData": {"id": message["id"]}}]}

    relay = f"{graph.stack.relay_url}/v1/inbound/graph"
    wrong = await graph.http.post(relay, json=forged(sub["id"], "not-the-client-state"))
    unknown = await graph.http.post(relay, json=forged("00000000-dead-beef", "x"))
    missed = await graph.http.post(relay, json={"value": [{
        "subscriptionId": sub["id"], "lifecycleEvent": "missed", "clientState": "guess"}]})
    assert (wrong.status_code, unknown.status_code, missed.status_code) == (401, 401, 401)
    await asyncio.sleep(5)
    assert await items(db, [message["id"]]) == []
    # The genuine notification (the sandbox knows the clientState) is taken.
    notified = await graph.deliver(notify=1)
    assert notified["notifications"] == [202]
    await wait_items(env, db, [notified["id"]])
    assert await items(db, [message["id"]]) == []


async def test_each_message_is_one_item_even_when_notified_twice(
        env: StackClient, db: asyncpg.Pool, graph: GraphMailbox) -> None:
    graph.add()
    await watching(env, graph)
    sent = [await graph.deliver(notify=2) for _ in range(4)]
    assert all(m["notifications"] == [202, 202] for m in sent)
    ids = [m["id"] for m in sent]
    rows = await wait_items(env, db, ids)
    await asyncio.sleep(3)
    rows = await items(db, ids)
    assert sorted(r["delivery_id"] for r in rows) == sorted(ids)
    assert {r["workflow_id"] for r in rows} == {
        f"inbound/acme/graph/{ADDRESS}/{i}" for i in ids}
    listed = json.loads(graph.cli("mailbox", "list", "--tenant", "acme", "--json").stdout)
    mine = [m for m in listed if m["kind"] == "graph"]
    assert len(mine) == 1 and mine[0]["state"] == "watching"
    assert mine[0]["cursor"]["delta"] is True


async def test_a_gap_is_caught_up_by_delta_after_missed(
        env: StackClient, db: asyncpg.Pool, graph: GraphMailbox) -> None:
    graph.add()
    await watching(env, graph)
    notified = [await graph.deliver(notify=1) for _ in range(2)]
    await wait_items(env, db, [m["id"] for m in notified])
    gap = [await graph.deliver(notify=0) for _ in range(3)]
    await asyncio.sleep(4)
    assert await items(db, [m["id"] for m in gap]) == []  # Graph told nothing: not read yet
    answer = await graph.lifecycle("missed")
    assert answer["notifications"] == [202]
    ids = [m["id"] for m in notified + gap]
    await wait_items(env, db, ids)
    await asyncio.sleep(2)
    assert len(await items(db, ids)) == len(ids)
    # Nothing left to find: a sync stores nothing new.
    synced = graph.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS, "--json")
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout)["stored"] == 0
    # The run so far (signals, fetches, delta rounds, the sync update) replays in the SDK's
    # sandbox: the workflow is deterministic.
    client = await env.temporal()
    history = await client.get_workflow_handle(
        f"mailbox/acme/graph/{ADDRESS}/inbox").fetch_history()
    await Replayer(workflows=[GraphMailboxWorkflow],
                   data_converter=client.data_converter).replay_workflow(history)


async def test_mail_before_the_mailbox_was_added_is_caught_up_on_start(
        env: StackClient, db: asyncpg.Pool, graph: GraphMailbox) -> None:
    before = [await graph.deliver(notify=0) for _ in range(2)]
    graph.add()
    await wait_items(env, db, [m["id"] for m in before])


async def test_removed_subscription_is_recreated_and_caught_up(
        env: StackClient, db: asyncpg.Pool, graph: GraphMailbox) -> None:
    graph.add()
    first = await watching(env, graph)
    gap = await graph.deliver(notify=0)
    assert (await graph.lifecycle("subscriptionRemoved"))["notifications"] == [202]

    async def replaced() -> dict[str, Any] | None:
        subs = await graph.subscriptions()
        return subs[0] if len(subs) == 1 and subs[0]["id"] != first["id"] else None

    await env.wait_for(replaced, timeout=60, what="a new subscription")
    await wait_items(env, db, [gap["id"]])
    after = await graph.deliver(notify=1)
    assert after["notifications"] == [202]
    await wait_items(env, db, [after["id"]])


async def test_reauthorization_required_renews(
        env: StackClient, db: asyncpg.Pool, graph: GraphMailbox) -> None:
    graph.add()
    sub = await watching(env, graph)
    await asyncio.sleep(1.1)
    assert (await graph.lifecycle("reauthorizationRequired"))["notifications"] == [202]

    async def renewed() -> dict[str, Any] | None:
        subs = await graph.subscriptions()
        done = (len(subs) == 1 and subs[0]["id"] == sub["id"] and not subs[0]["reauthorize"]
                and subs[0]["expirationDateTime"] != sub["expirationDateTime"])
        return subs[0] if done else None

    await env.wait_for(renewed, timeout=60, what="the subscription renewed")
