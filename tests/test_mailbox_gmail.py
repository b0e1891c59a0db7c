"""The Gmail API source on the real stack: the sandbox's Gmail subset and its Pub/Sub pushes
(signed OIDC tokens) to the relay, a watcher worker of the test's own, and the count taken
where a person would look: the items in the `inbound_events` ledger, the messages in the
sandbox's mailbox, the contacts and emails on the sandbox.

- a forged push (a token signed with another key, for another audience, by another
  service account, none at all) is a 401, and wakes nothing: mail waiting in the mailbox
  stays unread until an authentic push arrives;
- each delivered message is one item; the same push twice, and the same message delivered
  twice, are still one item (the second delivery a copy);
- a history gap (the stored historyId expired: 404) is caught up by the bounded full sync
  with nothing lost and nothing run twice;
- the watch is renewed when its 7 days are nearly up;
- `mailbox remove` stops the watch at Gmail's end (`users.stop`, recorded by the sandbox):
  no further push, and the watcher has closed when the command returns.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from temporalio.client import WorkflowExecutionStatus
from temporalio.worker import Replayer

from inboxcrm.platform.gmail_config import LOCAL_PUSH_AUDIENCE, LOCAL_PUSH_SERVICE_ACCOUNT
from inboxcrm.schemas.mailboxes import GMAIL_STOP_PATCH, mailbox_workflow_id
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from inboxcrm.workflows.mailbox_gmail import GmailWatchWorkflow
from tests.helpers.own_worker import OwnWorker

ADDRESS = "sales@acme.test"
TOKEN = "ya29.gmail-stack-test-token"
TOKEN_ENV = "INBOXCRM_TEST_GMAIL_TOKEN"
TOPIC = "projects/inboxcrm-test/topics/gmail-inbox"
# No periodic catch-up during a test: only a push (or a sync) wakes the watcher.
RHYTHM = {"INBOXCRM_GMAIL_POLL_SECONDS": "3600"}


class GmailBox:
    """The sandbox's mailbox of `sales@acme.test`, its registration, watcher worker and CLI."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.sandbox = httpx.AsyncClient(base_url=stack.sandbox_url, timeout=30)
        self.worker = OwnWorker(stack, **{TOKEN_ENV: TOKEN})
        self.senders: list[str] = []
        self.gmail_ids: list[str] = []

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(self.stack.env, INBOXCRM_TASK_QUEUE=self.worker.task_queue, **RHYTHM)
        return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    async def prepare(self) -> None:
        (await self.sandbox.post("/_sandbox/gmail/users",
                                 json={"email": ADDRESS, "token": TOKEN})).raise_for_status()
        (await self.sandbox.post("/_sandbox/gmail/push-subscriptions", json={
            "topic": TOPIC, "endpoint": f"{self.stack.relay_url}/v1/inbound/gmail",
            "audience": LOCAL_PUSH_AUDIENCE,
            "service_account": LOCAL_PUSH_SERVICE_ACCOUNT})).raise_for_status()

    def add(self) -> None:
        done = self.cli("mailbox", "add", "gmail", "--tenant", "acme", "--address", ADDRESS,
                        "--oauth-token-env", TOKEN_ENV, "--topic", TOPIC)
        assert done.returncode == 0, done.stderr

    async def deliver(self, count: int = 1, push: bool = True, raw: str | None = None
                      ) -> list[dict[str, Any]]:
        answers = []
        for _ in range(count):
            email = unique_email("gmail")
            answer = await self.sandbox.post("/_sandbox/gmail/deliver", json={
                "email": ADDRESS, "raw": raw or message_from(email), "push": push})
            answer.raise_for_status()
            answers.append(answer.json())
            self.gmail_ids.append(answer.json()["id"])
            if raw is None:
                self.senders.append(email)
        return answers

    async def push_again(self) -> int | None:
        answer = await self.sandbox.post("/_sandbox/gmail/push", json={"email": ADDRESS})
        answer.raise_for_status()
        return answer.json()["push_status"]  # type: ignore[no-any-return]

    async def state(self) -> dict[str, Any]:
        answer = await self.sandbox.get("/_sandbox/gmail/state", params={"email": ADDRESS})
        answer.raise_for_status()
        return dict(answer.json())


@pytest.fixture
async def box(stack: Stack) -> AsyncIterator[GmailBox]:
    mailbox = GmailBox(stack)
    await mailbox.prepare()
    yield mailbox
    mailbox.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    mailbox.worker.stop_all()
    await mailbox.sandbox.aclose()


async def items(db: asyncpg.Pool, box: GmailBox) -> list[asyncpg.Record]:
    """The gmail items of this test's messages, and the copies recorded of them."""
    return list(await db.fetch(
        "SELECT delivery_id, workflow_id, state FROM inbound_events"
        " WHERE tenant = 'acme' AND source = 'gmail' AND mailbox = $1"
        " AND delivery_id = ANY($2) ORDER BY received_at", ADDRESS, box.gmail_ids))


async def wait_items(env: StackClient, db: asyncpg.Pool, box: GmailBox, count: int,
                     timeout: float = 90) -> list[asyncpg.Record]:
    async def done() -> list[asyncpg.Record] | None:
        rows = await items(db, box)
        settled = [r for r in rows if r["state"] in ("completed", "awaiting_review")]
        return rows if len(rows) >= count and len(settled) == len(rows) else None

    rows: list[asyncpg.Record] = await env.wait_for(done, timeout=timeout,
                                                    what=f"{count} gmail items done")
    return rows


async def assert_once_each(env: StackClient, senders: list[str]) -> None:
    state = await env.sandbox_state()
    for email in senders:
        contacts = [c for c in state["contacts"]
                    if str(c["properties"].get("email", "")).lower() == email]
        emails = [m for m in state["emails"] if email in [t.lower() for t in m["to"]]]
        assert len(contacts) == 1, (email, contacts)
        assert len(emails) == 1, (email, emails)


def own_key_token(kid: str, audience: str = LOCAL_PUSH_AUDIENCE,
                  email: str = LOCAL_PUSH_SERVICE_ACCOUNT, issuer: str = "") -> str:
    """A well-formed token under the sandbox's key ID, signed with another key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    return jwt.encode({"iss": issuer, "aud": audience, "email": email, "email_verified": True,
                       "iat": now, "exp": now + 600}, key, algorithm="RS256",
                      headers={"kid": kid})


async def test_forged_pushes_are_refused_and_wake_nothing(
        env: StackClient, db: asyncpg.Pool, box: GmailBox, stack: Stack) -> None:
    """Mail waits in the mailbox (delivered without a push) after the watcher's first
    catch-up; forged pushes naming the mailbox are 401s and leave it unread; one authentic
    push brings it in."""
    box.worker.start()
    box.add()
    await env.wait_for(lambda: _cursor(db), timeout=60, what="the first catch-up")
    await box.deliver(2, push=False)
    kid = jwt.get_unverified_header((await box.sandbox.post("/_sandbox/gmail/sign", json={
        "audience": LOCAL_PUSH_AUDIENCE, "email": LOCAL_PUSH_SERVICE_ACCOUNT})).json()["token"]
    )["kid"]

    async def signed(audience: str, email: str) -> str:
        answer = await box.sandbox.post("/_sandbox/gmail/sign",
                                        json={"audience": audience, "email": email})
        return str(answer.json()["token"])

    body = {"message": {"data": "eyJlbWFpbEFkZHJlc3MiOiAic2FsZXNAYWNtZS50ZXN0IiwgImhpc3Rv"
                                "cnlJZCI6IDk5OTk5OTk5fQ==", "messageId": "1",
                        "publishTime": "2026-01-01T00:00:00Z"},
            "subscription": "projects/inboxcrm-test/subscriptions/forged"}
    forged = {
        "another key": own_key_token(kid, issuer=stack.sandbox_url),
        "another audience": await signed("https://elsewhere.example/push",
                                         LOCAL_PUSH_SERVICE_ACCOUNT),
        "another service account": await signed(LOCAL_PUSH_AUDIENCE,
                                                "intruder@evil.iam.gserviceaccount.com"),
        "not a token": "not-a-jwt",
    }
    async with httpx.AsyncClient(base_url=stack.relay_url) as relay:
        for what, token in forged.items():
            answer = await relay.post("/v1/inbound/gmail", json=body,
                                      headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 401, (what, answer.text)
        assert (await relay.post("/v1/inbound/gmail", json=body)).status_code == 401
        # A refused push's body is never looked at: one that is not even JSON is a 401 too.
        assert (await relay.post("/v1/inbound/gmail", content=b"{not json",
                                 headers={"Authorization": "Bearer x"})).status_code == 401
    await _quiet(3)
    assert await items(db, box) == []  # nothing woke the watcher, nothing stored

    assert await box.push_again() == 200  # the sandbox's own, signed as configured
    rows = await wait_items(env, db, box, 2)
    assert len(rows) == 2
    await assert_once_each(env, box.senders)


async def test_each_message_is_one_item_however_often_it_is_pushed(
        env: StackClient, db: asyncpg.Pool, box: GmailBox) -> None:
    early = await box.deliver(2, push=False)  # before anything watched: the first catch-up
    box.worker.start()
    box.add()
    await wait_items(env, db, box, 2)
    late = await box.deliver(3)
    assert all(a["push_status"] == 200 for a in late)
    rows = await wait_items(env, db, box, 5)
    for _ in range(2):
        assert await box.push_again() == 200
    # The same message (one Message-ID, one content) delivered to the mailbox once more.
    copied = message_from(unique_email("gmail-copy"))
    await box.deliver(raw=copied)
    await box.deliver(raw=copied)
    rows = await wait_items(env, db, box, 6)
    await _quiet(3)
    rows = await items(db, box)
    mailbox = await box.state()
    assert len(mailbox["messages"]) == 7 and len(box.gmail_ids) == 7
    assert len(rows) == 6, rows  # the 7th message is a copy of the 6th
    assert {r["workflow_id"] for r in rows} == {
        f"inbound/acme/gmail/{ADDRESS}/{gid}" for gid in box.gmail_ids[:6]}
    copies = await db.fetch("SELECT delivery_id FROM inbound_copies WHERE source = 'gmail'"
                            " AND delivery_id = ANY($1)", box.gmail_ids)
    assert [c["delivery_id"] for c in copies] == [box.gmail_ids[6]]
    await assert_once_each(env, box.senders)
    assert {e["id"] for e in early} <= {r["delivery_id"] for r in rows}

    listed = box.cli("mailbox", "list", "--tenant", "acme", "--json")
    assert listed.returncode == 0, listed.stderr
    [mine] = [m for m in json.loads(listed.stdout) if m["kind"] == "gmail"]
    assert mine["state"] == "watching" and mine["folder"] == "INBOX"
    assert mine["cursor"]["history_id"] == mailbox["historyId"]
    synced = box.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS, "--json")
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout) == {"stored": 0, "duplicates": 0, "copies": 0}


async def test_a_history_gap_is_caught_up_with_nothing_lost_or_repeated(
        env: StackClient, db: asyncpg.Pool, box: GmailBox) -> None:
    box.worker.start()
    box.add()
    await box.deliver(2)
    await wait_items(env, db, box, 2)
    # Pushes lost, and the history they stood for expired (Gmail keeps about a week).
    await box.deliver(3, push=False)
    (await box.sandbox.post("/_sandbox/gmail/expire-history",
                            json={"email": ADDRESS})).raise_for_status()
    await box.deliver(1)  # this push's catch-up gets the 404: the full sync
    rows = await wait_items(env, db, box, 6)
    await _quiet(3)
    rows = await items(db, box)
    assert len(rows) == 6 and len({r["delivery_id"] for r in rows}) == 6
    assert len((await box.state())["messages"]) == 6
    await assert_once_each(env, box.senders)
    # After the gap, history works again from the new cursor.
    await box.deliver(1)
    assert len(await wait_items(env, db, box, 7)) == 7


async def test_the_watch_is_renewed_before_it_lapses(
        env: StackClient, db: asyncpg.Pool, box: GmailBox) -> None:
    box.worker.start()
    box.add()
    await env.wait_for(lambda: _cursor(db), timeout=60, what="the first catch-up")
    calls = (await box.state())["watch"]["calls"]
    await db.execute("UPDATE mailbox_subscriptions SET expires_at = now() + interval '2 hours'"
                     " WHERE kind = 'gmail' AND address = $1", ADDRESS)
    synced = box.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS, "--json")
    assert synced.returncode == 0, synced.stderr
    assert (await box.state())["watch"]["calls"] == calls + 1
    left = await db.fetchval("SELECT expires_at - now() FROM mailbox_subscriptions"
                             " WHERE kind = 'gmail' AND address = $1", ADDRESS)
    assert left.total_seconds() > 6.9 * 86400


async def test_remove_stops_the_watch_at_gmails_end(
        env: StackClient, db: asyncpg.Pool, box: GmailBox) -> None:
    """The watcher, cancelled by `mailbox remove`, calls `users.stop` before it ends (the
    `gmail-stop-on-remove` marker first): the sandbox records one stop of a live watch,
    the watch is gone, and mail delivered afterwards is pushed to no one."""
    box.worker.start()
    box.add()
    await env.wait_for(lambda: _cursor(db), timeout=60, what="the first catch-up")
    [pushed] = await box.deliver(1)
    assert pushed["push_status"] == 200
    await wait_items(env, db, box, 1)
    assert (await box.state())["stops"] == []

    removed = box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    assert removed.returncode == 0, removed.stderr
    # The command waited for the watcher: closed, and the stop made, when it returns.
    client = await env.temporal()
    handle = client.get_workflow_handle(mailbox_workflow_id("acme", "gmail", ADDRESS, "INBOX"))
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    state = await box.state()
    assert [s["had_watch"] for s in state["stops"]] == [True]
    assert state["watch"] is None
    pushes = len(state["pushes"])
    [after] = await box.deliver(1)
    assert after["push_status"] is None  # no watch: nothing is pushed
    assert len((await box.state())["pushes"]) == pushes

    history = await handle.fetch_history()
    markers = [e.marker_recorded_event_attributes for e in history.events
               if e.HasField("marker_recorded_event_attributes")]
    assert [json.loads(m.details["patch-data"].payloads[0].data)["id"] for m in markers] \
        == [GMAIL_STOP_PATCH]
    stops = [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
             and e.activity_task_scheduled_event_attributes.activity_type.name
             == "stop_gmail_watch"]
    assert len(stops) == 1
    await Replayer(workflows=[GmailWatchWorkflow],
                   data_converter=client.data_converter).replay_workflow(history)


async def _cursor(db: asyncpg.Pool) -> Any:
    return await db.fetchval("SELECT cursor FROM mailbox_subscriptions WHERE kind = 'gmail'"
                             " AND address = $1", ADDRESS)


async def _quiet(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
