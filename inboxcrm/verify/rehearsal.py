"""`inboxcrm rehearse`: the synthetic failure rehearsal, run against the running stack before
live mail is connected. Each scenario injects a real fault into the sandbox, drives items
through the relay and the reviewer signals, and counts records on the destination side.

It uses the `rehearsal` tenant (policies/rehearsal.json) so its items are easy to tell
apart, and refuses to run unless every live worker of that tenant reports the sandbox as its
destination (`destination_problems`; the workers' own report, migration 079). Per case it
shows the CRM record, the review queue entry and where the evidence is. The worker restart
runs on a worker process of its own (`OwnWorkers`): the rehearsal never kills the stack's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inboxcrm.domain.policy import get_policy
from inboxcrm.ingress.intake import Delivery, Ingestor, TemporalHandle
from inboxcrm.operator.wake import wake_parked
from inboxcrm.platform.decisions import DecisionRequest, send_decision
from inboxcrm.platform.reviewer_identity import PATH_CLI, operator
from inboxcrm.schemas.contract import Decision
from inboxcrm.stack.processes import ManagedProcess, StackError, free_port, python
from inboxcrm.stack.stack import WORKER_READY
from inboxcrm.store import audit, items, review_tasks
from inboxcrm.verify.probe import StackClient, message_from, unique_email

TENANT = "rehearsal"
MAILBOX = "inbox@rehearsal.test"
# The worker restart: the sandbox holds the CRM call this long (uncommitted), and the
# rehearsal's own worker waits longer than that, so the kill lands inside the call.
RESTART_HANG_SECONDS = 20
RESTART_HTTP_TIMEOUT = "30"
# The hand-off: an expired CRM credential is an `access` failure, owned per policy `owners`.
HANDOFF_CAUSE = "access"
ACTOR = "rehearsal"


@dataclass
class Outcome:
    scenario: str
    expected: str
    crm_records: int
    emails: int
    final_state: str
    passed: bool
    note: str = ""
    workflow_id: str = ""
    # The sandbox's record: {"id", "fields"} (synthetic rehearsal data only).
    record: dict[str, Any] | None = None
    # The item's latest review task: reason, owner, escalation time, how it was resolved.
    queue_entry: dict[str, Any] | None = None
    # Where the story is: the audit entries' IDs and the command that prints them.
    evidence: dict[str, Any] = field(default_factory=dict)


def same_origin(url: str, sandbox_url: str) -> bool:
    """`url` is on the sandbox: same scheme, host (localhost is 127.0.0.1) and port."""
    def origin(value: str) -> tuple[str, str, int | None]:
        parts = urlsplit(value)
        host = (parts.hostname or "").lower()
        return parts.scheme, "127.0.0.1" if host == "localhost" else host, parts.port
    return bool(url) and origin(url) == origin(sandbox_url)


def destination_problems(workers: Sequence[Mapping[str, Any]], sandbox_url: str) -> list[str]:
    """Why the rehearsal must not run, from what each live worker of the tenant reported it
    would call: none reported (no worker, or one too old to report), or any CRM or mail
    destination that is not the sandbox. Empty: every one points at the sandbox."""
    if not workers:
        return [f"no live worker has reported the {TENANT} tenant's destinations (is the stack "
                "up, and are its workers of this version?)"]
    problems = []
    for worker in workers:
        for kind in ("crm", "mail"):
            url = str(worker[f"{kind}_url"])
            if not same_origin(url, sandbox_url):
                problems.append(f"worker {worker['worker_id']} (task queue "
                                f"{worker['task_queue']}) would call {kind} "
                                f"{worker[f'{kind}_provider']} at {url or 'an unknown URL'}")
    return problems


class OwnWorkers:
    """Worker processes of the rehearsal's own, on a task queue no other worker polls, with
    this process's environment (the stack's settings: `.data/stack.env`): the worker restart
    kills one of them, never one of the stack's."""

    def __init__(self, environ: Mapping[str, str], base_queue: str,
                 overrides: Mapping[str, str] | None = None, log_dir: Path | None = None
                 ) -> None:
        self.task_queue = f"{base_queue}-rehearsal-{uuid.uuid4().hex[:6]}"
        self.environ = dict(environ)
        self.overrides = dict(overrides or {})
        self.log_dir = log_dir or Path(tempfile.gettempdir()) / "inboxcrm-rehearsal"
        self.started: list[ManagedProcess] = []
        self.reap_leftovers()

    @property
    def pid_file(self) -> Path:
        return self.log_dir / "workers.pid"

    def reap_leftovers(self) -> None:
        """Stop the workers an earlier rehearsal started and could not stop (it was killed
        itself): each was recorded with its queue, and is stopped only while its command line
        still names that queue's worker (a pid may have been reused since)."""
        if not self.pid_file.exists():
            return
        for line in self.pid_file.read_text().splitlines():
            pid_text, _, queue = line.partition(" ")
            if pid_text.isdigit() and own_worker_alive(int(pid_text), queue):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid_text), signal.SIGTERM)
        self.pid_file.unlink(missing_ok=True)

    def start(self) -> ManagedProcess:
        """A new worker process on the queue; returns once it polls."""
        env = {**self.environ, "INBOXCRM_TASK_QUEUE": self.task_queue,
               "INBOXCRM_WORKER_METRICS_ADDRESS": f"127.0.0.1:{free_port()}",
               **self.overrides}
        number = len(self.started) + 1
        proc = ManagedProcess(f"{self.task_queue}-{number}", python("inboxcrm.worker"), env,
                              self.log_dir).start()
        self.started.append(proc)
        with self.pid_file.open("a") as pids:
            pids.write(f"{proc.pid} {self.task_queue}\n")
        proc.wait_ready(proc.log_has(WORKER_READY, since=proc.log_offset))
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            proc.stop()
        self.pid_file.unlink(missing_ok=True)


def own_worker_alive(pid: int, task_queue: str) -> bool:
    """The process is still the rehearsal's worker of `task_queue` (Linux: its environment
    names the queue; elsewhere nothing is stopped)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"INBOXCRM_TASK_QUEUE={task_queue}".encode() in environ.split(b"\0")


@dataclass(frozen=True)
class Expect:
    state: str
    crm_records: int
    emails: int

    def describe(self) -> str:
        return f"{self.state}, {self.crm_records} record, {self.emails} email"


def record_of(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sandbox record a case wrote (the first, when a failed case wrote more)."""
    if not records:
        return None
    return {"id": str(records[0].get("id")), "fields": dict(records[0].get("properties", {}))}


class Rehearsal:
    def __init__(self, client: StackClient, timeout: float = 90,
                 progress: Callable[[str], None] | None = None,
                 own_workers: Callable[..., OwnWorkers] | None = None) -> None:
        self.client = client
        self.timeout = timeout
        # How the worker restart gets worker processes it may kill (None: the case fails,
        # saying so; the stack's own workers are never killed).
        self.own_workers = own_workers
        # A line per scenario as it starts and ends (the CLI prints them on stderr).
        self.progress = progress or (lambda line: None)

    def raw(self, email: str, **kwargs: str) -> str:
        return message_from(email, **kwargs).replace("sales@acme.test", MAILBOX)

    async def deliver(self, raw: str, delivery_id: str | None = None) -> str:
        return await self.client.deliver(raw, delivery_id, tenant=TENANT, mailbox=MAILBOX)

    async def settle(self, workflow_id: str, states: set[str]) -> str:
        state, _ = await self.client.wait_state(workflow_id, states, timeout=self.timeout)
        return state

    async def observe(self, name: str, expect: Expect, email: str, workflow_id: str,
                      note: str = "") -> Outcome:
        state = await self.settle(workflow_id, {expect.state})
        records = await self.client.crm_records_for(email)
        emails = len(await self.client.emails_to(email))
        passed = (state, len(records), emails) == (expect.state, expect.crm_records,
                                                   expect.emails)
        return Outcome(name, expect.describe(), len(records), emails, state, passed, note,
                       workflow_id, record_of(records),
                       await self.queue_entry(workflow_id), await self.evidence(workflow_id))

    async def queue_entry(self, workflow_id: str) -> dict[str, Any] | None:
        row = await review_tasks.latest_task(self.client.db, workflow_id=workflow_id)
        if row is None:
            return None
        return {key: value.isoformat() if isinstance(value, datetime) else value
                for key, value in dict(row).items()}

    async def evidence(self, workflow_id: str) -> dict[str, Any]:
        async with self.client.db.acquire() as conn:
            ids = await audit.entry_ids(conn, workflow_id=workflow_id)
        return {"audit_ids": ids, "command": f"inboxcrm audit --workflow {workflow_id}"}

    # --- scenarios -------------------------------------------------------------------------
    async def duplicate_delivery(self) -> Outcome:
        email = unique_email("rh-dup")
        raw, delivery_id = self.raw(email), f"RH-{uuid.uuid4().hex[:10]}"
        answers = await asyncio.gather(*(self.client.post(raw, delivery_id, tenant=TENANT,
                                                          mailbox=MAILBOX) for _ in range(3)))
        statuses = sorted(a.json().get("status", "?") for a in answers)
        workflow_id = answers[0].json()["workflow_id"]
        outcome = await self.observe("duplicate delivery ×3", Expect("completed", 1, 1), email,
                                     workflow_id, note=",".join(statuses))
        outcome.passed &= statuses == ["accepted", "duplicate", "duplicate"]
        return outcome

    async def same_identity_same_second(self) -> Outcome:
        email = unique_email("rh-twin")
        first, second = await asyncio.gather(self.deliver(self.raw(email, subject="Pricing")),
                                             self.deliver(self.raw(email, subject="Demo")))
        await self.settle(first, {"completed"})
        outcome = await self.observe("two emails, one person, same second",
                                     Expect("completed", 1, 1), email, second)
        contacts = await self.client.contacts_for(email)
        outcome.passed &= contacts == 1
        outcome.note = f"{contacts} contact"
        return outcome

    async def crm_rate_limit(self) -> Outcome:
        email = unique_email("rh-429")
        await self.client.inject("crm.upsert", "rate_limit", count=2, retry_after=1)
        return await self.observe("CRM 429 with Retry-After", Expect("completed", 1, 1), email,
                                  await self.deliver(self.raw(email)))

    async def crm_invalid_field(self) -> Outcome:
        email = unique_email("rh-400")
        await self.client.inject("crm.upsert", "invalid_field")
        workflow_id = await self.deliver(self.raw(email))
        await self.settle(workflow_id, {"blocked"})
        await self.client.signal(workflow_id, Decision.RETRY, {"reviewer": "rehearsal",
                                                        "note": "field mapping fixed"})
        return await self.observe("CRM 400 → blocked → reviewer retry",
                                  Expect("completed", 1, 1), email, workflow_id)

    async def crm_expired_credential(self) -> Outcome:
        email = unique_email("rh-401")
        await self.client.inject("crm.upsert", "unauthorized")
        workflow_id = await self.deliver(self.raw(email))
        await self.settle(workflow_id, {"blocked"})
        await self.client.signal(workflow_id, Decision.REJECT, {"reviewer": "rehearsal"})
        return await self.observe("CRM 401 → blocked → reviewer reject",
                                  Expect("rejected", 0, 0), email, workflow_id)

    async def crm_timeout_after_commit(self) -> Outcome:
        email = unique_email("rh-crm-timeout")
        await self.client.inject("crm.upsert", "timeout_after_commit")
        return await self.observe("CRM timeout after commit", Expect("completed", 1, 1), email,
                                  await self.deliver(self.raw(email)))

    async def mail_timeout_after_commit(self) -> Outcome:
        email = unique_email("rh-mail-timeout")
        await self.client.inject("mail.send", "timeout_after_commit")
        return await self.observe("mail timeout after accept", Expect("completed", 1, 1), email,
                                  await self.deliver(self.raw(email)))

    async def search_index_lag(self) -> Outcome:
        email = unique_email("rh-lag")
        await self.client.sandbox_config(search_lag_seconds=120)
        await self.client.inject("crm.upsert", "timeout_after_commit")
        try:
            return await self.observe("CRM timeout + lagging search", Expect("completed", 1, 1),
                                      email, await self.deliver(self.raw(email)))
        finally:
            await self.client.sandbox_config(search_lag_seconds=2)

    async def auto_reply_ignored(self) -> Outcome:
        email = unique_email("rh-ooo")
        raw = self.raw(email, subject="Automatic reply", body="I am out of the office.\n")
        raw = "Auto-Submitted: auto-replied\r\n" + raw
        return await self.observe("auto-reply", Expect("ignored", 0, 0), email,
                                  await self.deliver(raw))

    async def opt_out(self) -> Outcome:
        email = unique_email("rh-optout")
        opt_out = await self.deliver(self.raw(email, subject="unsubscribe",
                                              body="Please unsubscribe me.\n"))
        await self.settle(opt_out, {"suppressed"})
        return await self.observe("opt-out, then an inquiry", Expect("suppressed", 1, 0), email,
                                  await self.deliver(self.raw(email)))

    async def review_then_approve(self) -> Outcome:
        email = unique_email("rh-review")
        raw = (f"To: {MAILBOX}\r\nSubject: pricing\r\nMessage-ID: <{uuid.uuid4().hex}@x>\r\n"
               "Content-Type: text/plain\r\n\r\nPricing please.\r\n")
        workflow_id = await self.deliver(raw)
        await self.settle(workflow_id, {"awaiting_review"})
        await self.client.signal(workflow_id, Decision.APPROVE, {
            "reviewer": "rehearsal", "corrections": {"sender_email": email}})
        return await self.observe("no sender → review → approve", Expect("completed", 1, 1),
                                  email, workflow_id)

    async def worker_restart(self) -> Outcome:
        """A worker process killed (SIGKILL) while the sandbox holds its CRM call, then a new
        one started: the item completes once. On worker processes of the rehearsal's own."""
        if self.own_workers is None:
            raise ValueError("no worker process of the rehearsal's own to kill")
        if self.client.settings is None:
            raise ValueError("the worker restart needs the stack's settings")
        workers = self.own_workers(INBOXCRM_HTTP_TIMEOUT_SECONDS=RESTART_HTTP_TIMEOUT)
        email = unique_email("rh-restart")
        try:
            await asyncio.to_thread(workers.start)
            await self.client.sandbox_config(hang_seconds=RESTART_HANG_SECONDS)
            held_before = await self.held_calls()
            await self.client.inject("crm.upsert", "timeout_before_commit")
            ingestor = Ingestor(self.client.db, TemporalHandle(self.client.settings),
                                workers.task_queue)
            result = await ingestor.ingest(Delivery(
                TENANT, "standard", MAILBOX, f"RH-{uuid.uuid4().hex[:10]}",
                self.raw(email).encode()))

            async def held() -> bool:
                return await self.held_calls() > held_before

            await self.client.wait_for(held, timeout=self.timeout,
                                       what="the CRM call held by the sandbox")
            killed = workers.started[-1]
            pid = killed.pid
            await asyncio.to_thread(killed.kill)
            await asyncio.to_thread(workers.start)
            outcome = await self.observe(
                "worker kill -9 inside the CRM call → restart", Expect("completed", 1, 1),
                email, result.workflow_id,
                note=f"killed pid {pid} (signal {int(signal.SIGKILL)}), started pid "
                     f"{workers.started[-1].pid}")
            outcome.evidence["worker_logs"] = str(workers.log_dir)
            return outcome
        finally:
            await asyncio.to_thread(workers.stop_all)

    async def held_calls(self) -> int:
        calls = await self.client.calls("crm.upsert")
        return sum(1 for c in calls if c.get("outcome") == "timeout_before_commit")

    async def switch_sends(self, paused: bool) -> int:
        """`inboxcrm pause|resume --tenant rehearsal --scope send`: the same switch, and on
        resume the same wake-up of the parked items. Returns how many were woken."""
        async with self.client.db.acquire() as conn:
            await items.set_pause(conn, TENANT, "send", paused, ACTOR)
        if paused:
            return 0
        return await wake_parked(await self.client.temporal(TENANT), TENANT, "send")

    async def pause_procedure(self) -> Outcome:
        """The runbook's pause: sends paused, an item parks (never fails, sends nothing),
        resume wakes it and it completes once."""
        email = unique_email("rh-pause")
        await self.switch_sends(paused=True)
        try:
            workflow_id = await self.deliver(self.raw(email))

            async def parked() -> bool:
                return await self.client.state(workflow_id) == ("send_pending", "paused")

            await self.client.wait_for(parked, timeout=self.timeout, what="the item parked")
            sent_while_paused = len(await self.client.emails_to(email))
        finally:
            woken = await self.switch_sends(paused=False)
        outcome = await self.observe("pause sends → item parks → resume",
                                     Expect("completed", 1, 1), email, workflow_id,
                                     note=f"parked (send_pending/paused), {woken} woken")
        outcome.passed &= sent_while_paused == 0
        return outcome

    async def manual_handoff(self) -> Outcome:
        """An item blocked (an expired CRM credential), in the review queue under the owner
        the policy names for its cause, decided through the one decision client as `inboxcrm
        review retry` does, then completes."""
        settings = self.client.settings
        secret = (settings.decision_secret.get_secret_value()
                  if settings is not None and settings.decision_secret else None)
        email = unique_email("rh-handoff")
        await self.client.inject("crm.upsert", "unauthorized")
        workflow_id = await self.deliver(self.raw(email))
        await self.settle(workflow_id, {"blocked"})
        entry = await self.queue_entry(workflow_id)
        if entry is None:
            raise ValueError("blocked, but no review queue entry")
        owner = get_policy(TENANT).owner_for(str(entry["reason"]), HANDOFF_CAUSE)
        decision = await send_decision(self.client.temporal, secret, DecisionRequest(
            workflow_id=workflow_id, action=Decision.RETRY, decider=operator(), path=PATH_CLI,
            reviewer=str(entry["owner"]), note="rehearsal: credential renewed"))
        outcome = await self.observe("blocked → hand-off to its owner → retry",
                                     Expect("completed", 1, 1), email, workflow_id,
                                     note=f"owner {entry['owner']}; decision "
                                          f"{decision.outcome}")
        outcome.passed &= decision.accepted and entry["owner"] == owner
        return outcome

    def scenarios(self) -> list[Callable[[], Awaitable[Outcome]]]:
        return [self.duplicate_delivery, self.same_identity_same_second, self.crm_rate_limit,
                self.crm_invalid_field, self.crm_expired_credential,
                self.crm_timeout_after_commit, self.mail_timeout_after_commit,
                self.search_index_lag, self.auto_reply_ignored, self.opt_out,
                self.review_then_approve, self.worker_restart, self.pause_procedure,
                self.manual_handoff]

    async def run(self) -> list[Outcome]:
        outcomes = []
        scenarios = self.scenarios()
        for number, scenario in enumerate(scenarios, 1):
            name = scenario.__name__.replace("_", " ")
            self.progress(f"[{number}/{len(scenarios)}] {name}…")
            await self.client.reset_faults()
            try:
                outcomes.append(await scenario())
            except (AssertionError, KeyError, ValueError, StackError) as exc:
                outcomes.append(Outcome(name, "see note", 0, 0, "?", False, str(exc)[:120]))
            done = outcomes[-1]
            self.progress(f"[{number}/{len(scenarios)}] {done.scenario}: "
                          f"{'pass' if done.passed else 'FAIL'} ({done.final_state})")
        await self.client.reset_faults()
        return outcomes
