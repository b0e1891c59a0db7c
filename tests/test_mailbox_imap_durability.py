"""Issue 34's durability run of the IMAP source, against a real Dovecot
(tests/helpers/dovecot.py) and three worker processes of the test's own
(tests/helpers/own_worker.py), every fault injected for real:

- mail appended while the stack runs (INBOXCRM_IMAP_DURABILITY_MESSAGES, default 200), some
  of it one message at a time, some in bursts that land at once;
- the watcher's worker killed with kill -9 twice in the middle of a fetch (the second time
  while it re-reads the folder after its UIDVALIDITY changed), a fresh worker started after
  each so that three run again;
- `doveadm kick` dropping the IDLE connection;
- every worker stopped while 50 more messages arrive, then three started again;
- the folder's UIDVALIDITY changed once, its messages kept.

Then, counted where a person would look: every message is one item (`inbound_events`, the
roles in `imap_messages`), each sender one CRM contact and one follow-up (the sandbox's
`GET /_sandbox/state`), and Dovecot never held more sessions of the account than the
registration's cap. Dovecot's own `mail_max_userip_connections` is set to that cap, so a
login beyond it would be refused and logged; `doveadm who` is also sampled throughout.

Marked `long` (`make test-long`, which CI runs): a few minutes on a loaded 2-core machine at
the default size.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from temporalio.api.enums.v1 import PendingActivityState

from inboxcrm.stack.processes import ManagedProcess
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers import dovecot as dovecot_helper
from tests.helpers.dovecot import Dovecot
from tests.helpers.own_worker import OwnWorker

pytestmark = [pytest.mark.skipif(not dovecot_helper.available(), reason=dovecot_helper.MISSING),
              pytest.mark.long]

USER = "durable"
PASSWORD = "imap-durability-password"
PASSWORD_ENV = "INBOXCRM_TEST_IMAP_PASSWORD"
ADDRESS = "sales@acme.test"
# The registration's cap, and Dovecot's: one watched folder holds one connection.
CAP = 1
WORKERS = 3
# The figures; a smaller run (for a quick look) with the environment variable.
MESSAGES = int(os.environ.get("INBOXCRM_IMAP_DURABILITY_MESSAGES", "200"))
WHILE_DOWN = 50
RHYTHM = {"INBOXCRM_IMAP_HEARTBEAT_SECONDS": "4", "INBOXCRM_IMAP_IDLE_SECONDS": "20"}
# Bursts are padded so that a fetch of ten takes a while: the kill lands inside one.
PADDING = 150_000


@pytest.fixture(scope="module")
def dovecot() -> Iterator[Dovecot]:
    root = Path(tempfile.mkdtemp(prefix="inboxcrm-dovecot-durable-"))
    server = Dovecot(root, max_userip_connections=CAP).start({USER: PASSWORD})
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


class Run:
    """The watched folder, a staging folder for bursts, the workers and what was sent."""

    def __init__(self, stack: Stack, server: Dovecot, db: asyncpg.Pool) -> None:
        self.stack, self.server, self.db = stack, server, db
        self.folder = f"D{uuid.uuid4().hex[:8]}"
        self.staging = f"S{uuid.uuid4().hex[:8]}"
        self.worker = OwnWorker(stack, **{PASSWORD_ENV: PASSWORD})
        self.senders: list[str] = []
        self.kills: list[dict[str, int]] = []
        self.events: list[str] = []
        self.started_at = time.monotonic()
        server.create_folder(USER, self.folder)
        server.create_folder(USER, self.staging)

    def note(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.started_at:7.1f}s {what}")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(self.stack.env, INBOXCRM_TASK_QUEUE=self.worker.task_queue, **RHYTHM)
        return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    def workers(self) -> list[ManagedProcess]:
        return [p for p in self.worker.started if p.alive()]

    def start_workers(self) -> None:
        while len(self.workers()) < WORKERS:
            self.worker.start()

    def _raw(self, padding: int) -> tuple[str, bytes]:
        email = unique_email("imapdur")
        body = ("Hi, could you send me pricing for 20 seats?\n\nThanks,\nJane Doe\n"
                "Example Corp\n" + ("x" * 76 + "\n") * (padding // 77))
        return email, message_from(email, body=body).encode()

    async def append(self, count: int, pause: float = 0.0) -> None:
        """Append `count` messages to the watched folder one at a time (as delivery does)."""
        for _ in range(count):
            email, raw = self._raw(0)
            await asyncio.to_thread(self.server.deliver, USER, raw, self.folder)
            self.senders.append(email)
            if pause:
                await asyncio.sleep(pause)

    async def burst(self, count: int) -> None:
        """`count` padded messages land in the watched folder at once (staged, then moved)."""
        for _ in range(count):
            email, raw = self._raw(PADDING)
            await asyncio.to_thread(self.server.deliver, USER, raw, self.staging)
            self.senders.append(email)
        await asyncio.to_thread(self.server.move_all, USER, self.staging, self.folder)

    async def rows(self, uidvalidity: int | None = None) -> int:
        return int(await self.db.fetchval(
            "SELECT count(*) FROM imap_messages WHERE tenant = 'acme' AND address = $1"
            " AND folder = $2 AND ($3::bigint IS NULL OR uidvalidity = $3)",
            ADDRESS, self.folder, uidvalidity))

    async def items(self) -> int:
        return int(await self.db.fetchval(
            "SELECT count(*) FROM imap_messages WHERE tenant = 'acme' AND address = $1"
            " AND folder = $2 AND role = 'item'", ADDRESS, self.folder))

    async def wait_rows(self, env: StackClient, count: int, uidvalidity: int | None = None,
                        timeout: float = 300) -> None:
        async def enough() -> bool:
            return await self.rows(uidvalidity) >= count

        await env.wait_for(enough, timeout=timeout, what=f"{count} messages of the folder read")

    async def watcher_pid(self, env: StackClient) -> int | None:
        """The process ID of the worker whose attempt of the watch is running now."""
        client = await env.temporal()
        described = await client.get_workflow_handle(
            f"mailbox/acme/imap/{ADDRESS}/{self.folder}").describe()
        for act in described.raw_description.pending_activities:
            if (act.activity_type.name == "watch_imap_folder"
                    and act.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                    and act.last_worker_identity):
                return int(act.last_worker_identity.split("@", 1)[0])
        return None

    async def kill_during_fetch(self, env: StackClient, count: int,
                                uidvalidity: int | None = None) -> None:
        """A burst of `count` lands; once the watcher has stored a few of it (it is fetching
        the rest, ten at a time), its worker is killed with kill -9; a new one starts."""
        pid = await env.wait_for(lambda: self.watcher_pid(env), timeout=120,
                                 what="the watch running")
        victim = next(p for p in self.workers() if p.pid == pid)
        # During a re-read after a UIDVALIDITY change every message of the folder is read
        # again: the kill then lands among the re-read ones as well as the burst's.
        expected = count + (await self.rows() - await self.rows(uidvalidity)
                            if uidvalidity is not None else await self.rows())
        before = await self.rows(uidvalidity)
        await self.burst(count)
        deadline = time.monotonic() + 120
        stored = before
        while time.monotonic() < deadline:
            stored = await self.rows(uidvalidity)
            if stored >= before + 3:
                break
            await asyncio.sleep(0.02)
        victim.kill()
        self.kills.append({"pid": pid, "stored_before_burst": before,
                           "stored_at_kill": stored, "expected_after": expected})
        self.note(f"kill -9 worker {pid}: {stored - before} of this read stored")
        assert before + 3 <= stored < expected, (
            f"the kill came outside the fetch ({stored} of {expected} read)")
        self.worker.start()


async def sample_connections(server: Dovecot, seen: list[int], errors: list[str]) -> None:
    while True:
        try:
            seen.append(await asyncio.to_thread(server.connections, USER))
        except RuntimeError as exc:
            errors.append(str(exc)[:200])
        await asyncio.sleep(0.25)


async def test_every_message_is_one_item_through_kills_kicks_and_renumbering(
        env: StackClient, db: asyncpg.Pool, stack: Stack, dovecot: Dovecot) -> None:
    assert MESSAGES >= 50, "INBOXCRM_IMAP_DURABILITY_MESSAGES: at least 50"
    burst = max(20, MESSAGES // 5)
    first, second = (MESSAGES - 2 * burst) // 3, (MESSAGES - 2 * burst) // 3
    last = MESSAGES - 2 * burst - first - second
    run = Run(stack, dovecot, db)
    seen: list[int] = []
    sample_errors: list[str] = []
    sampler = asyncio.create_task(sample_connections(dovecot, seen, sample_errors))
    try:
        run.start_workers()
        added = run.cli("mailbox", "add", "imap", "--tenant", "acme", "--address", ADDRESS,
                        "--host", "127.0.0.1", "--port", str(dovecot.port), "--tls", "none",
                        "--username", USER, "--password-env", PASSWORD_ENV,
                        "--folder", run.folder, "--max-connections", str(CAP))
        assert added.returncode == 0, added.stderr
        run.note(f"{WORKERS} workers, watcher added (cap {CAP})")

        # 1. Mail arrives one message at a time while the watcher runs.
        await run.append(first, pause=0.05)
        await run.wait_rows(env, len(run.senders))
        run.note(f"{first} appended one by one, read")

        # 2. kill -9 the watcher's worker in the middle of a fetch.
        await run.kill_during_fetch(env, burst)
        await run.wait_rows(env, len(run.senders))
        run.note(f"burst of {burst} read after the kill")

        # 3. The server drops the IDLE connection; the watcher logs in again.
        await env.wait_for(lambda: run.watcher_pid(env), timeout=120,
                           what="the watch running again")
        logins = dovecot.logins(USER)
        dovecot.kick(USER)

        async def logged_in_again() -> bool:
            return dovecot.logins(USER) > logins

        await env.wait_for(logged_in_again, timeout=120, what="the watcher logged in again")
        run.note("doveadm kick: logged in again")
        await run.append(second, pause=0.05)
        await run.wait_rows(env, len(run.senders))
        run.note(f"{second} appended after the kick, read")

        # 4. No worker runs while 50 messages arrive; three start again and catch up.
        for proc in run.workers():
            await asyncio.to_thread(proc.stop)
        run.note("every worker stopped")
        await run.append(WHILE_DOWN)
        await asyncio.sleep(2)
        assert await run.rows() == len(run.senders) - WHILE_DOWN
        run.start_workers()
        await run.wait_rows(env, len(run.senders))
        run.note(f"{WHILE_DOWN} appended while down, caught up by {WORKERS} new workers")

        # 5. The folder is renumbered (messages kept); a burst lands and the watcher's worker
        # is killed while it re-reads the folder.
        old = dovecot.status(USER, run.folder)["uidvalidity"]
        new = old + 1000
        kept = dovecot.status(USER, run.folder)["messages"]
        dovecot.set_uidvalidity(USER, new, run.folder)
        run.note(f"UIDVALIDITY {old} -> {new}, {kept} messages kept")
        await run.kill_during_fetch(env, burst, uidvalidity=new)
        await run.wait_rows(env, kept + burst, uidvalidity=new)
        run.note(f"folder re-read and burst of {burst} read after the second kill")

        # 6. The rest, one at a time.
        await run.append(last, pause=0.05)
        total = len(run.senders)
        assert total == MESSAGES + WHILE_DOWN
        await run.wait_rows(env, kept + (total - kept), uidvalidity=new)

        async def settled() -> bool:
            done = await db.fetchval(
                "SELECT count(*) FROM inbound_events WHERE tenant = 'acme' AND source = 'imap'"
                " AND mailbox = $1 AND split_part(delivery_id, ':', 1) = $2"
                " AND state IN ('completed', 'awaiting_review')", ADDRESS, run.folder)
            return int(done) >= total

        await env.wait_for(settled, timeout=600, what=f"{total} items settled")
        await asyncio.sleep(3)  # nothing more may appear
        run.note(f"{total} items settled")
    finally:
        sampler.cancel()
        run.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
        run.worker.stop_all()

    # Every message one item: the ledger, and the identity of each sighting.
    events = await db.fetch(
        "SELECT delivery_id, message_id, state FROM inbound_events WHERE tenant = 'acme'"
        " AND source = 'imap' AND mailbox = $1 AND split_part(delivery_id, ':', 1) = $2",
        ADDRESS, run.folder)
    roles = {(r["uidvalidity"], r["role"]): int(r["n"]) for r in await db.fetch(
        "SELECT uidvalidity, role, count(*) AS n FROM imap_messages WHERE tenant = 'acme'"
        " AND address = $1 AND folder = $2 GROUP BY 1, 2", ADDRESS, run.folder)}
    distinct_ids = {r["message_id"] for r in events}
    states: dict[str, int] = {}
    for r in events:
        states[r["state"]] = states.get(r["state"], 0) + 1

    # Each sender one contact and one follow-up, on the destination.
    state = await env.sandbox_state()
    contacts: dict[str, int] = {}
    for c in state["contacts"]:
        email = str(c["properties"].get("email", "")).lower()
        contacts[email] = contacts.get(email, 0) + 1
    followups: dict[str, int] = {}
    for m in state["emails"]:
        for to in m["to"]:
            followups[to.lower()] = followups.get(to.lower(), 0) + 1
    per_sender = [(contacts.get(s, 0), followups.get(s, 0)) for s in run.senders]

    refused = dovecot.refused_logins(USER)
    summary = {
        "appended": total, "while_down": WHILE_DOWN, "workers": WORKERS, "cap": CAP,
        "events": len(events), "distinct_message_ids": len(distinct_ids), "states": states,
        "roles": {f"{uv - old}:{role}": n for (uv, role), n in sorted(roles.items())},
        "senders_with_one_contact": sum(1 for c, _ in per_sender if c == 1),
        "senders_with_one_followup": sum(1 for _, f in per_sender if f == 1),
        "max_contacts_per_sender": max(c for c, _ in per_sender),
        "max_followups_per_sender": max(f for _, f in per_sender),
        "kills": run.kills, "logins": dovecot.logins(USER), "refused_logins": refused,
        "connection_samples": len(seen), "max_connections_seen": max(seen, default=-1),
        "sample_errors": len(sample_errors),
    }
    print("\n".join(run.events))
    print(json.dumps(summary, indent=1))

    assert len(events) == total and len(distinct_ids) == total, summary
    assert roles == {(old, "item"): kept, (new, "reseen"): kept,
                     (new, "item"): total - kept}, summary
    assert states.get("completed", 0) == total, summary
    assert all(c == 1 for c, _ in per_sender), summary
    assert all(f == 1 for _, f in per_sender), summary
    assert refused == 0, summary
    assert len(seen) > 20 and max(seen) <= CAP, summary
    assert max(seen) == CAP
    assert len(run.kills) == 2
