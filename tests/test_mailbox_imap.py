"""IMAP mailbox sources against a real Dovecot (tests/helpers/dovecot.py), with worker
processes of the test's own (kill -9 for real) and the count taken where a person would
look: the sandbox's contacts and emails, and the `inbound_events` ledger.

- mail that arrives while the watcher runs becomes one item each; mail that arrived while
  nothing watched is caught up on start; the mailbox is never changed (nothing is \\Seen);
- a worker killed in the middle of a catch-up, and the next one, store each message once;
- `doveadm kick` drops the IDLE connection: the watcher reconnects and goes on;
- a UIDVALIDITY change re-reads the folder and runs nothing again;
- the server never sees more connections of the account than registered.
"""

from __future__ import annotations

import asyncio
import imaplib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from temporalio.worker import Replayer

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from inboxcrm.workflows.mailbox_watch import MailboxWatchWorkflow
from tests.helpers import dovecot as dovecot_helper
from tests.helpers.dovecot import Dovecot
from tests.helpers.metrics import sample, scrape_until
from tests.helpers.own_worker import OwnWorker

pytestmark = pytest.mark.skipif(not dovecot_helper.available(), reason=dovecot_helper.MISSING)

USER = "sales"
PASSWORD = "imap-test-password"
PASSWORD_ENV = "INBOXCRM_TEST_IMAP_PASSWORD"
# The test server takes an XOAUTH2 token where its passwd-file has the password: enough to
# prove the SASL exchange; a real provider checks the token with its issuer.
OAUTH_USER = "oauth"
OAUTH_TOKEN = "ya29.test-access-token"
OAUTH_ENV = "INBOXCRM_TEST_IMAP_TOKEN"
ADDRESS = "sales@acme.test"
# The watcher's rhythm in these tests: a killed worker is noticed within seconds.
RHYTHM = {"INBOXCRM_IMAP_HEARTBEAT_SECONDS": "4", "INBOXCRM_IMAP_IDLE_SECONDS": "20"}


@pytest.fixture(scope="module")
def dovecot() -> Iterator[Dovecot]:
    # Not under pytest's tmp_path: its parents are private to root, and Dovecot's own
    # processes (user `dovecot`) must reach their files.
    root = Path(tempfile.mkdtemp(prefix="inboxcrm-dovecot-"))
    # No keep-alive in IDLE for 15 minutes: a watcher that waits in IDLE after news it was
    # already told of is not woken by one (test_mail_that_arrives_during_a_catch_up_...).
    server = Dovecot(root, idle_notify_seconds=900).start(
        {USER: PASSWORD, OAUTH_USER: OAUTH_TOKEN})
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


class Mailbox:
    """One folder of the test's own in the Dovecot account, its watcher's worker and CLI."""

    def __init__(self, stack: Stack, server: Dovecot, **rhythm: str) -> None:
        self.stack, self.server = stack, server
        self.folder = f"T{uuid.uuid4().hex[:8]}"
        self.worker = OwnWorker(stack, **{PASSWORD_ENV: PASSWORD, OAUTH_ENV: OAUTH_TOKEN})
        self.rhythm = {**RHYTHM, **rhythm}
        self.senders: list[str] = []
        server.create_folder(USER, self.folder)

    def cli(self, *args: str, **env_over: str) -> subprocess.CompletedProcess[str]:
        env = dict(self.stack.env, INBOXCRM_TASK_QUEUE=self.worker.task_queue, **self.rhythm,
                   **env_over)
        return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    def add(self, *folders: str, max_connections: int = 2, user: str = USER,
            credential: tuple[str, str] = ("--password-env", PASSWORD_ENV),
            after_store: str = "none") -> None:
        extra = [x for f in folders for x in ("--folder", f)]
        done = self.cli("mailbox", "add", "imap", "--tenant", "acme", "--address", ADDRESS,
                        "--host", "127.0.0.1", "--port", str(self.server.port),
                        "--tls", "none", "--username", user, *credential,
                        "--folder", self.folder, *extra,
                        "--max-connections", str(max_connections),
                        "--after-store", after_store)
        assert done.returncode == 0, done.stderr

    def deliver(self, count: int, folder: str | None = None, padding: int = 0,
                user: str = USER) -> list[str]:
        sent = []
        for _ in range(count):
            email = unique_email("imap")
            body = ("Hi, could you send me pricing for 20 seats?\n\nThanks,\nJane Doe\n"
                    "Example Corp\n" + ("x" * 76 + "\n") * (padding // 77))
            raw = message_from(email, body=body)
            self.server.deliver(user, raw.encode(), folder or self.folder)
            sent.append(email)
        self.senders += sent
        return sent


@pytest.fixture
async def mailbox(stack: Stack, dovecot: Dovecot) -> AsyncIterator[Mailbox]:
    box = Mailbox(stack, dovecot)
    yield box
    box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    box.worker.stop_all()


async def ledger(db: asyncpg.Pool, folder: str) -> list[asyncpg.Record]:
    return list(await db.fetch(
        "SELECT delivery_id, workflow_id, state, workflow_started_at FROM inbound_events"
        " WHERE tenant = 'acme' AND source = 'imap' AND mailbox = $1"
        " AND split_part(delivery_id, ':', 1) = $2 ORDER BY delivery_id", ADDRESS, folder))


async def wait_items_done(env: StackClient, db: asyncpg.Pool, folder: str, count: int,
                          timeout: float = 120) -> list[asyncpg.Record]:
    async def done() -> list[asyncpg.Record] | None:
        rows = await ledger(db, folder)
        settled = [r for r in rows if r["state"] in ("completed", "awaiting_review")]
        return rows if len(rows) >= count and len(settled) == len(rows) else None

    rows: list[asyncpg.Record] = await env.wait_for(done, timeout=timeout,
                                                    what=f"{count} items of {folder} done")
    return rows


async def assert_once_each(env: StackClient, senders: list[str]) -> None:
    """One CRM contact and one acknowledgment per sender: counted on the destination."""
    state = await env.sandbox_state()
    for email in senders:
        contacts = [c for c in state["contacts"]
                    if str(c["properties"].get("email", "")).lower() == email]
        emails = [m for m in state["emails"] if email in [t.lower() for t in m["to"]]]
        assert len(contacts) == 1, (email, contacts)
        assert len(emails) == 1, (email, emails)


def unseen(server: Dovecot, folder: str) -> int:
    out = server.doveadm("search", "-u", USER, "mailbox", folder, "UNSEEN")
    return len(out.splitlines())


async def test_mail_is_caught_up_on_start_and_watched_after(
        env: StackClient, db: asyncpg.Pool, mailbox: Mailbox, dovecot: Dovecot) -> None:
    """Two messages wait in the folder before anything watches it; three arrive while the
    watcher runs. Five items, one contact and one email each; the folder is untouched; a
    sync afterwards finds nothing new."""
    early = mailbox.deliver(2)
    mailbox.worker.start()
    mailbox.add()
    await wait_items_done(env, db, mailbox.folder, 2)
    late = mailbox.deliver(3)
    rows = await wait_items_done(env, db, mailbox.folder, 5)
    assert len(rows) == 5
    uidvalidity = dovecot.status(USER, mailbox.folder)["uidvalidity"]
    assert sorted(r["delivery_id"] for r in rows) == sorted(
        f"{mailbox.folder}:{uidvalidity}:{uid}" for uid in range(1, 6))
    assert all(r["workflow_id"].startswith(f"inbound/acme/imap/{ADDRESS}/{mailbox.folder}:")
               for r in rows)
    await assert_once_each(env, early + late)
    assert unseen(dovecot, mailbox.folder) == 5  # EXAMINE and BODY.PEEK[]: nothing \Seen

    listed = mailbox.cli("mailbox", "list", "--tenant", "acme", "--json")
    assert listed.returncode == 0, listed.stderr
    mine = [m for m in json.loads(listed.stdout) if m["folder"] == mailbox.folder]
    assert len(mine) == 1 and mine[0]["state"] == "watching"
    assert mine[0]["cursor"]["highest_uid"] == 5 and mine[0]["last_stored_at"]
    # Read up to date after the catch-up that stored the last message (the stall alert's
    # clock): not before that message was stored.
    assert mine[0]["last_checked_at"] and mine[0]["last_checked_at"] >= mine[0]["last_stored_at"]
    assert {"tenant", "address", "kind", "folder", "state", "cursor",
            "last_stored_at", "last_checked_at"} <= set(mine[0])
    # The relay's store gauges see the watching folder, and how long since it was checked
    # (the two mailbox alerts read these; no address among the labels).
    text = await scrape_until(env, mailbox.stack.relay_metrics_url, lambda t: (sample(
        t, "inboxcrm_mailbox_folders", '{kind="imap",state="watching"}') or 0) >= 1)
    age = sample(text, "inboxcrm_mailbox_oldest_check_age_seconds", '{kind="imap"}')
    assert age is not None and age >= 0
    assert ADDRESS not in "".join(line for line in text.splitlines() if "inboxcrm_mailbox" in line)

    synced = mailbox.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS,
                         "--json")
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout) == {"stored": 0, "duplicates": 0, "copies": 0}
    again = mailbox.cli("mailbox", "add", "imap", "--tenant", "acme", "--address", ADDRESS,
                        "--host", "127.0.0.1", "--port", str(dovecot.port), "--tls", "none",
                        "--username", USER, "--password-env", PASSWORD_ENV,
                        "--folder", mailbox.folder)
    assert again.returncode != 0 and "already watched" in again.stderr

    # Removed and added again: the stored messages are not run again.
    removed = mailbox.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    assert removed.returncode == 0, removed.stderr
    mailbox.add()
    synced = mailbox.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS,
                         "--json")
    assert json.loads(synced.stdout) == {"stored": 0, "duplicates": 0, "copies": 0}
    assert len(await ledger(db, mailbox.folder)) == 5
    await assert_once_each(env, early + late)


@pytest.mark.parametrize(("args", "env_over", "says"), [
    (("--address", "someone@elsewhere.test", "--tls", "tls"), {}, "not one of tenant"),
    (("--address", ADDRESS, "--tls", "none"), {"INBOXCRM_ENV": "production"},
     "only with INBOXCRM_ENV=local"),
    (("--address", ADDRESS, "--tls", "tls", "--oauth-token-env", OAUTH_ENV), {},
     "exactly one of"),
    (("--address", ADDRESS, "--tls", "tls", "--after-store", "delete"), {}, "--after-store"),
])
async def test_a_registration_that_cannot_be_right_is_refused(
        mailbox: Mailbox, db: asyncpg.Pool, args: tuple[str, ...], env_over: dict[str, str],
        says: str) -> None:
    done = mailbox.cli("mailbox", "add", "imap", "--tenant", "acme", "--host", "127.0.0.1",
                       "--port", "993", "--username", USER, "--password-env", PASSWORD_ENV,
                       "--folder", mailbox.folder, *args, **env_over)
    assert done.returncode != 0 and says in " ".join(done.stderr.split()), done.stderr
    assert await db.fetchval("SELECT count(*) FROM mailboxes WHERE folder = $1",
                             mailbox.folder) == 0


async def test_mail_that_arrived_while_no_worker_ran_is_caught_up(
        env: StackClient, db: asyncpg.Pool, mailbox: Mailbox) -> None:
    """The only worker stops; three messages arrive; the next worker's watcher stores
    them, once each."""
    mailbox.worker.start()
    first = mailbox.deliver(1)
    mailbox.add()
    await wait_items_done(env, db, mailbox.folder, 1)
    mailbox.worker.current.stop()
    while_down = mailbox.deliver(3)
    await asyncio.sleep(2)
    assert len(await ledger(db, mailbox.folder)) == 1
    mailbox.worker.start()
    rows = await wait_items_done(env, db, mailbox.folder, 4)
    assert len(rows) == 4
    await assert_once_each(env, first + while_down)


async def test_worker_killed_mid_fetch_stores_each_message_once(
        env: StackClient, db: asyncpg.Pool, mailbox: Mailbox) -> None:
    """kill -9 the worker while its watcher is part-way through a catch-up of 60 messages;
    the next worker carries on from the cursor: 60 events, one contact and one email each."""
    total = 60
    senders = mailbox.deliver(total, padding=150_000)
    worker = mailbox.worker.start()
    mailbox.add()
    deadline = time.monotonic() + 60
    stored = 0
    while time.monotonic() < deadline:
        stored = await db.fetchval(
            "SELECT count(*) FROM imap_messages WHERE folder = $1", mailbox.folder)
        if stored >= 3:
            break
        await asyncio.sleep(0.02)
    worker.kill()
    assert 3 <= stored < total, f"the kill came after the catch-up ({stored} stored)"
    mailbox.worker.start()
    rows = await wait_items_done(env, db, mailbox.folder, total, timeout=240)
    assert len(rows) == total
    identities = await db.fetch(
        "SELECT uid, role FROM imap_messages WHERE folder = $1", mailbox.folder)
    assert sorted(r["uid"] for r in identities) == list(range(1, total + 1))
    assert {r["role"] for r in identities} == {"item"}
    await assert_once_each(env, senders)


async def test_a_kicked_connection_reconnects(
        env: StackClient, db: asyncpg.Pool, mailbox: Mailbox, dovecot: Dovecot) -> None:
    """`doveadm kick` drops the watcher's IDLE connection; it logs in again and the next
    message is stored."""
    mailbox.worker.start()
    mailbox.add()
    first = mailbox.deliver(1)
    await wait_items_done(env, db, mailbox.folder, 1)
    logins = dovecot.logins(USER)
    dovecot.kick(USER)
    await env.wait_for(lambda: _async(dovecot.logins(USER) > logins), timeout=60,
                       what="the watcher logged in again")
    second = mailbox.deliver(1)
    rows = await wait_items_done(env, db, mailbox.folder, 2)
    assert len(rows) == 2
    await assert_once_each(env, first + second)


async def test_uidvalidity_change_rereads_without_rerunning(
        env: StackClient, db: asyncpg.Pool, mailbox: Mailbox, dovecot: Dovecot) -> None:
    """The server renumbers the folder (a new UIDVALIDITY, the messages kept). The watcher
    reads it again, matches the three it stored by Message-ID and content hash, and only
    the message new since then becomes an item."""
    mailbox.worker.start()
    before = mailbox.deliver(3)
    mailbox.add()
    await wait_items_done(env, db, mailbox.folder, 3)
    old = dovecot.status(USER, mailbox.folder)["uidvalidity"]
    dovecot.set_uidvalidity(USER, old + 1000, mailbox.folder)
    after = mailbox.deliver(1)
    rows = await wait_items_done(env, db, mailbox.folder, 4)
    await asyncio.sleep(3)  # nothing more may appear
    rows = await ledger(db, mailbox.folder)
    assert len(rows) == 4
    assert sum(1 for r in rows if f":{old + 1000}:" in r["delivery_id"]) == 1
    roles = await db.fetch(
        "SELECT uidvalidity, role FROM imap_messages WHERE folder = $1", mailbox.folder)
    assert sorted((r["uidvalidity"] - old, r["role"]) for r in roles) == sorted(
        [(0, "item")] * 3 + [(1000, "reseen")] * 3 + [(1000, "item")])
    await assert_once_each(env, before + after)


async def test_connections_stay_within_the_registered_cap(
        env: StackClient, db: asyncpg.Pool, stack: Stack, dovecot: Dovecot) -> None:
    """Two folders, two workers, one connection allowed: Dovecot never holds more than one
    session of the account, and both folders' mail is stored (the watchers take turns); a
    sync of both folders waits its turn too."""
    box = Mailbox(stack, dovecot, INBOXCRM_IMAP_SESSION_SECONDS="6")
    second = f"T{uuid.uuid4().hex[:8]}"
    dovecot.create_folder(USER, second)
    try:
        box.worker.start()
        box.worker.start()
        box.add(second, max_connections=1)
        sent = box.deliver(2) + box.deliver(2, folder=second)
        seen: list[int] = []

        async def sample() -> None:
            while True:
                seen.append(dovecot.connections(USER))
                await asyncio.sleep(0.2)

        sampler = asyncio.create_task(sample())
        try:
            await wait_items_done(env, db, box.folder, 2, timeout=120)
            await wait_items_done(env, db, second, 2, timeout=120)
            # A sync of both folders needs connections too: it waits its turn.
            synced = await asyncio.to_thread(
                box.cli, "mailbox", "sync", "--tenant", "acme", "--address", ADDRESS, "--json")
            assert synced.returncode == 0, synced.stderr
            assert json.loads(synced.stdout) == {"stored": 0, "duplicates": 0, "copies": 0}
        finally:
            sampler.cancel()
        assert seen and max(seen) <= 1, seen
        assert max(seen) == 1
        await assert_once_each(env, sent)
    finally:
        box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
        box.worker.stop_all()


async def _async(value: bool) -> bool:
    return value


async def test_the_same_message_in_two_folders_is_one_item_and_a_copy(
        env: StackClient, db: asyncpg.Pool, mailbox: Mailbox, dovecot: Dovecot) -> None:
    """One message filed into two watched folders (same Message-ID, same bytes): one item,
    the other folder's sighting recorded as its copy; a sync stores nothing more."""
    other = f"T{uuid.uuid4().hex[:8]}"
    dovecot.create_folder(USER, other)
    email = unique_email("imapcopy")
    raw = message_from(email).encode()
    dovecot.deliver(USER, raw, mailbox.folder)
    mailbox.worker.start()
    mailbox.add(other)
    await wait_items_done(env, db, mailbox.folder, 1)
    dovecot.deliver(USER, raw, other)
    await env.wait_for(lambda: db.fetchval(
        "SELECT count(*) FROM imap_messages WHERE folder = $1 AND role = 'copy'", other),
        timeout=60, what="the copy recorded")
    assert await ledger(db, other) == []
    first = (await ledger(db, mailbox.folder))[0]
    event_id = await db.fetchval(
        "SELECT event_id FROM inbound_events WHERE workflow_id = $1", first["workflow_id"])
    copy_of = await db.fetchval(
        "SELECT event_id FROM imap_messages WHERE folder = $1 AND role = 'copy'", other)
    assert copy_of == event_id
    synced = mailbox.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS,
                         "--json")
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout) == {"stored": 0, "duplicates": 0, "copies": 0}
    await assert_once_each(env, [email])


async def test_the_watcher_continues_as_new_and_keeps_its_place(
        env: StackClient, db: asyncpg.Pool, stack: Stack, dovecot: Dovecot) -> None:
    """Short sessions and a short history limit: the watcher's run continues as new several
    times; mail delivered across those runs is stored once each, none read twice."""
    box = Mailbox(stack, dovecot, INBOXCRM_IMAP_SESSION_SECONDS="1",
                  INBOXCRM_IMAP_HISTORY_EVENTS_LIMIT="25")
    try:
        box.worker.start()
        box.add()
        client = await env.temporal()
        handle = client.get_workflow_handle(f"mailbox/acme/imap/{ADDRESS}/{box.folder}")
        first_run = (await handle.describe()).run_id
        sent = box.deliver(2)
        await wait_items_done(env, db, box.folder, 2)

        async def continued() -> bool:
            return (await handle.describe()).run_id != first_run

        await env.wait_for(continued, timeout=90, what="the watcher continued as new")
        # The finished run replays in the SDK's sandbox: the workflow is deterministic.
        history = await client.get_workflow_handle(
            handle.id, run_id=first_run).fetch_history()
        await Replayer(workflows=[MailboxWatchWorkflow],
                       data_converter=client.data_converter).replay_workflow(history)
        sent += box.deliver(2)
        rows = await wait_items_done(env, db, box.folder, 4)
        assert len(rows) == 4
        duplicates = await db.fetchval(
            "SELECT count(*) FROM imap_messages WHERE folder = $1 AND role <> 'item'",
            box.folder)
        assert duplicates == 0
        await assert_once_each(env, sent)
    finally:
        box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
        box.worker.stop_all()


async def test_an_oauth_mailbox_logs_in_with_xoauth2(
        env: StackClient, db: asyncpg.Pool, mailbox: Mailbox, dovecot: Dovecot) -> None:
    """--oauth-token-env: the watcher authenticates with SASL XOAUTH2 and stores the mail."""
    dovecot.create_folder(OAUTH_USER, mailbox.folder)
    sent = mailbox.deliver(1, user=OAUTH_USER)
    mailbox.worker.start()
    mailbox.add(user=OAUTH_USER, credential=("--oauth-token-env", OAUTH_ENV))
    await wait_items_done(env, db, mailbox.folder, 1)
    assert f"user=<{OAUTH_USER}>, method=XOAUTH2" in dovecot.log()
    await assert_once_each(env, sent)


async def test_a_refused_login_shows_as_an_error(
        env: StackClient, db: asyncpg.Pool, mailbox: Mailbox, dovecot: Dovecot) -> None:
    """A credential the server refuses: nothing stored, the folder listed in `error` with the
    reason (a code, never the secret), and the watcher keeps trying with backoff."""
    mailbox.deliver(1)
    mailbox.worker.start()
    mailbox.add(credential=("--password-env", OAUTH_ENV))  # the other account's secret

    async def errored() -> dict[str, object] | None:
        listed = mailbox.cli("mailbox", "list", "--json")
        mine = [m for m in json.loads(listed.stdout) if m["folder"] == mailbox.folder]
        return mine[0] if mine and mine[0]["state"] == "error" else None

    found = await env.wait_for(errored, timeout=60, what="the folder listed in error")
    assert found["last_error"] == "permanent:imap_authenticationfailed"
    assert OAUTH_TOKEN not in json.dumps(found)
    synced = mailbox.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS)
    assert synced.returncode != 0 and "imap_authenticationfailed" in synced.stderr
    assert await ledger(db, mailbox.folder) == []
    client = await env.temporal()
    described = await client.get_workflow_handle(
        f"mailbox/acme/imap/{ADDRESS}/{mailbox.folder}").describe()
    assert described.status is not None and described.status.name == "RUNNING"


async def test_processed_mail_is_moved_only_after_it_is_stored(
        env: StackClient, db: asyncpg.Pool, mailbox: Mailbox, dovecot: Dovecot) -> None:
    """--after-store move:FOLDER: each message leaves the watched folder once its item is
    stored, lands in the target folder, and is stored once."""
    target = f"Done{uuid.uuid4().hex[:6]}"
    dovecot.create_folder(USER, target)
    sent = mailbox.deliver(3)
    mailbox.worker.start()
    mailbox.add(after_store=f"move:{target}")
    await wait_items_done(env, db, mailbox.folder, 3)
    sent += mailbox.deliver(1)
    await wait_items_done(env, db, mailbox.folder, 4)

    async def moved() -> bool:
        return (dovecot.status(USER, mailbox.folder)["messages"] == 0
                and dovecot.status(USER, target)["messages"] == 4)

    await env.wait_for(moved, timeout=60, what="the stored mail moved")
    pending = await db.fetchval(
        "SELECT count(*) FROM imap_messages WHERE folder = $1 AND after_store_at IS NULL",
        mailbox.folder)
    assert pending == 0
    assert len(await ledger(db, mailbox.folder)) == 4
    await assert_once_each(env, sent)


async def test_processed_mail_can_be_flagged_seen(
        env: StackClient, db: asyncpg.Pool, mailbox: Mailbox, dovecot: Dovecot) -> None:
    """--after-store seen: stored messages are flagged \\Seen, and stay where they are."""
    sent = mailbox.deliver(2)
    mailbox.worker.start()
    mailbox.add(after_store="seen")
    await wait_items_done(env, db, mailbox.folder, 2)

    async def flagged() -> bool:
        return unseen(dovecot, mailbox.folder) == 0

    await env.wait_for(flagged, timeout=60, what="the stored mail flagged")
    assert dovecot.status(USER, mailbox.folder)["messages"] == 2
    await assert_once_each(env, sent)



async def test_mail_that_arrives_during_a_catch_up_is_read_without_waiting_for_idle(
        env: StackClient, db: asyncpg.Pool, stack: Stack, dovecot: Dovecot) -> None:
    """Twenty messages are APPENDed by another IMAP session while the watcher fetches a
    backlog of 40. The server announces them once, among the answers to the watcher's
    FETCH, and never again in the IDLE that follows: the watcher reads them straight after
    the backlog, not an IDLE period (10 minutes here) later."""
    box = Mailbox(stack, dovecot, INBOXCRM_IMAP_IDLE_SECONDS="600")
    appender = imaplib.IMAP4("127.0.0.1", dovecot.port)
    try:
        appender.login(USER, PASSWORD)
        backlog = box.deliver(40, padding=150_000)
        box.worker.start()
        box.add()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if await db.fetchval(
                    "SELECT count(*) FROM imap_messages WHERE folder = $1", box.folder) >= 3:
                break
            await asyncio.sleep(0.02)
        late = [unique_email("imaplate") for _ in range(20)]
        for email in late:
            assert appender.append(box.folder, None, None,
                                   message_from(email).encode())[0] == "OK"
        stored = await db.fetchval(
            "SELECT count(*) FROM imap_messages WHERE folder = $1", box.folder)
        assert stored < 40, f"the backlog was read before the late mail landed ({stored})"
        rows = await wait_items_done(env, db, box.folder, 60, timeout=240)
        assert len(rows) == 60
        await assert_once_each(env, backlog + late)
    finally:
        appender.logout()
        box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
        box.worker.stop_all()
