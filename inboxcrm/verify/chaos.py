"""The chaos driver (`inboxcrm chaos`, `make chaos`): real faults against a real stack, then
an operator clears the review queue, then the invariant checker must find nothing.

0. seeds a share of the senders (`existing_ratio`) as records that were in the CRM before
   inboxcrm, as a salesperson creates them (`POST /_sandbox/seed`: an owner, a field they
   set, no external ID of ours), so adoption runs under every fault below;
1. posts N signed deliveries concurrently (bounded), with redeliveries of the same delivery
   ID (~20%), same-identity collisions (~10%, some in the same second, some with a
   conflicting name or another letter case), a few opt-outs and auto-replies;
2. meanwhile injects sandbox faults (all six modes on crm.upsert / crm.search / mail.send,
   small counts, Retry-After 1) so that a set share of destination calls sees one, kill -9s
   the worker at random moments (and restarts it) and restarts the relay once; deliveries
   that fail meanwhile (503, connection errors) are retried like a provider would;
   With the long-fault phase on (`freeze_seconds`; `make chaos` turns it on), sends are
   paused for the acme tenant from the start (a pause spanning the run), and after the
   deliveries the store is frozen (every PostgreSQL process SIGSTOPped, not killed) for
   longer than any step's retry budget while the items are in flight; then it is thawed
   and `inboxcrm resume` lifts the pause (waking the parked items);
3. stops injecting, waits until nothing is in flight, then resolves every item left for
   review through the CLI like an operator (blocked → retry; ambiguous → resolve with the
   destination's ID if the record/email exists, else retry; awaiting_review/held → approve,
   hold or reject), round after round until the queue is empty or a bound is hit;
4. runs the invariant checker in settled mode, plus the adoption check: each seeded sender
   has exactly one record with its email, the seeded one, carrying our external ID (the
   contact's, once its CRM step ran), its owner and the salesperson's field untouched.

Every loop is bounded in count and time. No addresses or bodies are logged. Exit code
(`ChaosResult.exit_code`): 0 pass, 1 an invariant violation, 2 the run did not reach its
targets (fault share, kills, relay restart, every delivery accepted, review queue drained).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from inboxcrm.domain.followup import UNCONFIRMED_THEN
from inboxcrm.schemas.contract import WORKFLOW_TYPE, Decision
from inboxcrm.schemas.drift import LOGGED_ACTIONS
from inboxcrm.stack import postgres
from inboxcrm.stack.stack import Stack, worker_name
from inboxcrm.store import chaos_runs
from inboxcrm.verify import check
from inboxcrm.verify.probe import Endpoints, StackClient, message_from
from inboxcrm.workflows.step_options import STORE_WAIT_MAX

TARGETS = ("crm.upsert", "crm.search", "mail.send")
MODES = ("rate_limit", "server_error", "invalid_field", "unauthorized",
         "timeout_before_commit", "timeout_after_commit")
# Transient modes more often than permanent ones: most faults should heal on their own.
MODE_WEIGHTS = {"rate_limit": 3, "server_error": 3, "invalid_field": 1, "unauthorized": 1,
                "timeout_before_commit": 2, "timeout_after_commit": 2}
TARGET_WEIGHTS = {"crm.upsert": 4, "mail.send": 4, "crm.search": 1}
MAX_PENDING = {"crm.upsert": 2, "mail.send": 2, "crm.search": 1}
FIRST_NAMES = ("Maria", "James", "Aiko", "Olu", "Priya", "Lars", "Chen", "Fatima", "Diego",
               "Nora", "Tomas", "Leila", "Ivan", "Grace", "Samir", "Hanna")
LAST_NAMES = ("Lopez", "Smith", "Tanaka", "Adeyemi", "Sharma", "Berg", "Wang", "Haddad",
              "Rossi", "Novak", "Kim", "Fischer", "Costa", "Murphy", "Okafor", "Silva")
# What a salesperson set on the records seeded before the run (checked untouched after it).
SEED_OWNER = "7001"
SEED_FIELD = ("lifecyclestage", "customer")
CRMS = ("hubspot", "salesforce", "pipedrive")
OPT_OUT_BODY = "Please unsubscribe me from all emails.\n"
AUTO_REPLY_HEADERS = "Auto-Submitted: auto-replied\r\n"

Log = Callable[[str], None]


@dataclass(frozen=True)
class CrmView:
    """How the run's CRM holds what the checks read, in the sandbox's state: the property
    that carries our external ID, the owner's, a field a salesperson sets (its API name and
    value, and the name the sandbox's state shows it under), and which of our logged
    operations land as notes (Salesforce and Pipedrive log the conversation's emails as
    notes too: Tasks, notes; HubSpot as email engagements)."""

    name: str
    id_property: str
    owner_field: str
    seed_field: tuple[str, str]
    note_actions: tuple[str, ...] = ("crm-note",)
    seed_field_shown_as: str | None = None
    note_id_property: str = "inboxcrm_note_id"   # the unique key of our notes, where kept

    @property
    def shown_field(self) -> str:
        return self.seed_field_shown_as or self.seed_field[0]


def crm_view(crm: str, id_property: str | None = None) -> CrmView:
    """The view of `crm` (`hubspot`: the stack's sandbox provider, `salesforce`,
    `pipedrive`) as the sandbox models it. Pipedrive's `id_property` is the key Pipedrive
    gave our custom field (`pipedrive_field_key`)."""
    if crm == "salesforce":
        return CrmView(crm, "Inboxcrm_Contact_Id__c", "OwnerId", ("Department", "Key accounts"),
                       LOGGED_ACTIONS, seed_field_shown_as="department",
                       note_id_property="Inboxcrm_Note_Id__c")
    if crm == "pipedrive":
        if not id_property:
            raise ValueError("the Pipedrive view needs the custom field's key")
        return CrmView(crm, id_property, "owner_id", SEED_FIELD, LOGGED_ACTIONS)
    if crm != "hubspot":
        raise ValueError(f"unknown CRM {crm!r} (known: {', '.join(CRMS)})")
    return CrmView(crm, id_property or "inboxcrm_contact_id", "hubspot_owner_id", SEED_FIELD)


async def pipedrive_field_key(sandbox_url: str, token: str) -> str:
    """The key of our custom person field, found as the adapter finds it (by its label in
    `GET /v1/personFields`): Pipedrive names custom fields by a hash of its own."""
    from inboxcrm.adapters.pipedrive import PipedriveCrm

    crm = PipedriveCrm(sandbox_url, token)
    try:
        return await crm.field_key()
    finally:
        await crm.aclose()


def crm_env(crm: str, sandbox_url: str) -> dict[str, str]:
    """The settings that make the stack's tenants (their policies name no CRM of their
    own) use `crm` on the stack's sandbox: its Salesforce or Pipedrive surface."""
    if crm == "salesforce":
        return {"INBOXCRM_CRM_PROVIDER": "salesforce",
                "INBOXCRM_SALESFORCE_INSTANCE_URL": sandbox_url,
                "INBOXCRM_SALESFORCE_TOKEN": "chaos-salesforce-session"}
    if crm == "pipedrive":
        return {"INBOXCRM_CRM_PROVIDER": "pipedrive", "INBOXCRM_CRM_URL": sandbox_url,
                "INBOXCRM_CRM_TOKEN": "chaos-pipedrive-token"}
    crm_view(crm)  # refuses an unknown name
    return {}


@dataclass
class ChaosConfig:
    events: int = 100                 # distinct deliveries (redeliveries come on top)
    seed: int = 1
    concurrency: int = 20             # posts in flight at once
    rate: float = 8.0                 # deliveries started per second
    redelivery_ratio: float = 0.20
    collision_ratio: float = 0.10
    opt_out_ratio: float = 0.03
    auto_reply_ratio: float = 0.02
    existing_ratio: float = 0.10      # new senders already in the CRM (seeded before the run)
    fault_ratio: float = 0.18         # share of destination calls to fault while injecting
    kills: int = 3
    workers: int = 2                  # worker processes, the kills spread over all of them
    relay_restarts: int = 1
    min_fault_share: float = 0.10     # a run below this did not test enough (exit 2)
    settle_timeout: float = 150.0     # waiting for nothing in flight, each time
    resolve_rounds: int = 8
    cli_concurrency: int = 3
    deadline: float = 1800.0          # the whole run
    scope_to_run: bool = False        # check only this run's items (a shared store)
    reviewer: str = "chaos"
    post_attempts: int = 40           # per delivery, like a provider's redelivery budget
    # Long-fault phase: the store frozen this long (0: off) with sends paused over the run.
    # Longer than every retry budget against a frozen store (bookkeeping ~65 s, CRM/send
    # ~5 min, planning ~5 min; extraction's LLM-sized budget is longer, ~10 min).
    freeze_seconds: float = 0.0
    store_dir: str | None = None      # the embedded PostgreSQL's data directory (to freeze)
    # The CRM the run's tenant writes to (`CRMS`): the stack's own when `hubspot`; a fresh
    # stack (`run_on_fresh_stack`) is started with `crm_env` for the others.
    crm: str = "hubspot"
    # Salesforce's duplicate rule for the run (`none`, `alert`, `block`; None: the sandbox's,
    # `alert`): an org without one, one that reports, one that refuses the insert.
    salesforce_duplicate_rule: str | None = None


@dataclass
class ChaosStats:
    run_id: str = ""
    deliveries: int = 0
    posts: int = 0
    redeliveries: int = 0
    collisions: int = 0
    opt_outs: int = 0
    auto_replies: int = 0
    seeded: int = 0                   # senders seeded as pre-existing CRM records
    adopted: int = 0                  # of them: the one record carries our external ID
    seeded_unreached: int = 0         # of them: no CRM step of ours ran (e.g. rejected)
    answers: Counter[str] = field(default_factory=Counter)
    post_retries: int = 0
    posts_given_up: int = 0
    calls: int = 0
    faulted_calls: int = 0
    # The same two counts while faults were being injected (the chaos phase): the bar on the
    # fault share applies there, since the long-fault phase's paused sends all go out after
    # the faults are off and would dilute it.
    phase_calls: int = 0
    phase_faulted_calls: int = 0
    faults_injected: Counter[str] = field(default_factory=Counter)
    fault_outcomes: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    kills_by_worker: Counter[str] = field(default_factory=Counter)
    relay_restarts: int = 0
    store_frozen_s: float = 0.0
    in_flight_at_freeze: int = 0
    paused_over_run: bool = False
    failed_workflows: int = 0
    review_actions: Counter[str] = field(default_factory=Counter)
    cli_failures: int = 0
    resolution_rounds: int = 0
    review_left: int = 0
    final_states: Counter[str] = field(default_factory=Counter)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def fault_share(self) -> float:
        """Faulted calls among the calls made while faults were being injected."""
        return self.phase_faulted_calls / self.phase_calls if self.phase_calls else 0.0


@dataclass
class ChaosResult:
    config: ChaosConfig
    stats: ChaosStats
    report: check.CheckReport

    @property
    def targets_met(self) -> list[str]:
        """What this run failed to exercise (empty: a full run)."""
        s, c = self.stats, self.config
        missing = []
        if s.fault_share < c.min_fault_share:
            missing.append(f"fault share {s.fault_share:.1%} < {c.min_fault_share:.0%}")
        if s.kills < c.kills:
            missing.append(f"worker kills {s.kills} < {c.kills}")
        spread = min(c.workers, c.kills)
        if len(s.kills_by_worker) < spread:
            missing.append(f"kills reached {len(s.kills_by_worker)} of {spread} worker "
                           f"processes")
        if s.relay_restarts < c.relay_restarts:
            missing.append(f"relay restarts {s.relay_restarts} < {c.relay_restarts}")
        if s.posts_given_up:
            missing.append(f"{s.posts_given_up} deliveries never accepted")
        if s.review_left:
            missing.append(f"{s.review_left} items still in review")
        if s.seeded and not s.adopted:
            missing.append(f"none of the {s.seeded} pre-existing CRM records was adopted")
        if c.freeze_seconds and s.store_frozen_s < c.freeze_seconds:
            missing.append(f"store frozen {s.store_frozen_s:.0f}s < {c.freeze_seconds:.0f}s")
        return missing

    @property
    def exit_code(self) -> int:
        if not self.report.ok or self.stats.failed_workflows:
            return 1
        return 2 if self.targets_met else 0


@dataclass
class _Delivery:
    index: int
    delivery_id: str
    raw: str
    kind: str                        # new | collision | opt_out | auto_reply
    workflow_id: str | None = None
    email: str = ""
    name: str = ""


@dataclass
class _Seeded:
    """A sender that was in the CRM before the run, as a salesperson created it."""

    email: str
    name: str
    record_id: str = ""


# --- the plan ----------------------------------------------------------------------------
def plan_deliveries(config: ChaosConfig, run_id: str
                    ) -> tuple[list[_Delivery], list[tuple[float, _Delivery]]]:
    """Deterministic (per seed) deliveries and the posting schedule (seconds from start)."""
    rng = random.Random(config.seed)
    people: list[tuple[str, str]] = []
    deliveries: list[_Delivery] = []
    for n in range(config.events):
        delivery_id = f"chaos-{run_id}-{n:05d}"
        roll = rng.random()
        if people and roll < config.opt_out_ratio:
            email, name = rng.choice(people)
            raw = message_from(email, name=name, subject="unsubscribe", body=OPT_OUT_BODY)
            kind = "opt_out"
        elif people and roll < config.opt_out_ratio + config.collision_ratio:
            email, name = rng.choice(people[-20:])  # recent: likely still in flight
            if rng.random() < 0.3:
                email = email.upper()                # another letter case, same identity
            if rng.random() < 0.4:
                name = _name(rng, other_than=name)  # a conflicting name: review
            raw = message_from(email, name=name, subject=f"Follow-up question {n}")
            kind = "collision"
        elif roll < config.opt_out_ratio + config.collision_ratio + config.auto_reply_ratio:
            email, name = f"ooo{n}.{run_id}@example.com", "Away Person"
            raw = message_from(email, name=name, subject="Out of office",
                               body="I am out of the office until Monday.\n",
                               extra_headers=AUTO_REPLY_HEADERS)
            kind = "auto_reply"
        else:
            email, name = f"p{n}.{run_id}@example.com", _name(rng)
            people.append((email, name))
            raw = message_from(email, name=name, subject=f"Pricing question {n}")
            kind = "new"
        deliveries.append(_Delivery(n, delivery_id, raw, kind, email=email, name=name))
    spacing = 1.0 / max(config.rate, 0.1)
    schedule = [(d.index * spacing, d) for d in deliveries]
    for d in deliveries:
        if rng.random() < config.redelivery_ratio:
            # the same delivery again: at once (concurrent) or later (after processing)
            delay = 0.0 if rng.random() < 0.3 else rng.uniform(0.5, 20.0)
            schedule.append((d.index * spacing + delay, d))
    schedule.sort(key=lambda item: item[0])
    return deliveries, schedule


def plan_existing(config: ChaosConfig, deliveries: list[_Delivery]) -> list[_Seeded]:
    """The new senders (per seed, `existing_ratio` of them) already in the CRM before the run.
    A random stream of its own, so the deliveries and their schedule stay as they were."""
    rng = random.Random(config.seed * 104729 + 3)
    return [_Seeded(d.email, d.name) for d in deliveries
            if d.kind == "new" and rng.random() < config.existing_ratio]


def _name(rng: random.Random, other_than: str | None = None) -> str:
    for _ in range(10):
        name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        if name != other_than:
            return name
    return "Robin Quinn"


# --- the driver --------------------------------------------------------------------------
class ChaosRun:
    def __init__(self, stack: Stack, config: ChaosConfig, log: Log) -> None:
        self.stack = stack
        self.config = config
        self.log = log
        self.rng = random.Random(config.seed * 7919 + 1)
        self.stats = ChaosStats(run_id=uuid.uuid4().hex[:6])
        self.started = time.monotonic()
        self.injecting = False
        self.client: StackClient | None = None
        self.pool: asyncpg.Pool | None = None
        self.call_baseline = 0
        self.scope = f"inbound/acme/standard/sales@acme.test/chaos-{self.stats.run_id}-"
        self.cli_env = dict(stack.env, SANDBOX_URL=stack.sandbox_url, RELAY_URL=stack.relay_url,
                            INBOXCRM_STACK_ENV=str(stack.config.data_dir / "no-stack.env"))
        # The review decisions are a reviewer's: acme lets only a `lead` retry an
        # ambiguous send (policy `authority`), so the run signs in as one.
        self.review_env = dict(self.cli_env)
        self.crm = crm_view("hubspot", stack.env.get("INBOXCRM_CRM_ID_PROPERTY"))

    # ----- helpers
    def left(self) -> float:
        return self.config.deadline - (time.monotonic() - self.started)

    @property
    def env(self) -> StackClient:
        assert self.client is not None
        return self.client

    @property
    def db(self) -> asyncpg.Pool:
        assert self.pool is not None
        return self.pool

    def mark(self, name: str, since: float) -> None:
        self.stats.timings[name] = round(time.monotonic() - since, 1)

    # ----- run
    async def run(self) -> ChaosResult:
        from inboxcrm.store import db

        self.pool = await db.create_pool(self.stack.database_url, max_size=5)
        if self.config.crm == "pipedrive":
            self.crm = crm_view("pipedrive", await pipedrive_field_key(
                self.stack.sandbox_url, self.stack.env.get("INBOXCRM_CRM_TOKEN", "")))
        elif self.config.crm != "hubspot":
            self.crm = crm_view(self.config.crm)
        self.client = StackClient(Endpoints(self.stack.relay_url, self.stack.sandbox_url,
                                            self.stack.temporal_address,
                                            self.stack.env["INBOXCRM_WEBHOOK_SECRET"]),
                                  self.pool)
        try:
            return await self._run()
        finally:
            self.injecting = False
            with contextlib.suppress(httpx.HTTPError):
                await self.env.http.delete(f"{self.stack.sandbox_url}/_sandbox/faults")
            await self.env.aclose()
            await self.pool.close()

    async def _run(self) -> ChaosResult:
        config, stats = self.config, self.stats
        await self.env.reset_faults()
        if config.salesforce_duplicate_rule:
            (await self.env.http.post(f"{self.stack.sandbox_url}/_sandbox/config", json={
                "salesforce_duplicate_rule": config.salesforce_duplicate_rule})
             ).raise_for_status()
        self.call_baseline = len(await self._calls())
        deliveries, schedule = plan_deliveries(config, stats.run_id)
        stats.deliveries = len(deliveries)
        stats.posts = len(schedule)
        stats.redeliveries = len(schedule) - len(deliveries)
        kinds = Counter(d.kind for d in deliveries)
        stats.collisions, stats.opt_outs = kinds["collision"], kinds["opt_out"]
        stats.auto_replies = kinds["auto_reply"]
        seeded = await self._seed_existing(plan_existing(config, deliveries))
        self.log(f"run {stats.run_id}: {stats.deliveries} deliveries, {stats.posts} posts "
                 f"({stats.redeliveries} redeliveries), {stats.collisions} collisions, "
                 f"{stats.opt_outs} opt-outs, {stats.seeded} senders already in the CRM; "
                 f"{config.kills} kills over {config.workers} "
                 f"worker processes, {config.relay_restarts} relay restart(s)")
        await self._add_lead_reviewer()
        await self._start_workers()

        if config.freeze_seconds:
            await self._operator("pause", "--tenant", "acme", "--scope", "send")
            stats.paused_over_run = True
        phase = time.monotonic()
        window = max(schedule[-1][0] if schedule else 0.0,
                     config.kills * 6.0)
        self.injecting = True
        injector = asyncio.create_task(self._inject_faults())
        posting = len(deliveries) / max(config.rate, 0.1)
        disruptor = asyncio.create_task(self._disrupt(window, posting))
        try:
            await self._post_all(schedule)
            await disruptor
        finally:
            self.injecting = False
            disruptor.cancel()
            await asyncio.gather(injector, disruptor, return_exceptions=True)
            await self.env.http.delete(f"{self.stack.sandbox_url}/_sandbox/faults")
            await self._ensure_running()
        self.mark("chaos_phase_s", phase)
        await self._tally_calls()
        stats.phase_calls, stats.phase_faulted_calls = stats.calls, stats.faulted_calls
        self.log(f"chaos phase done in {stats.timings['chaos_phase_s']}s: "
                 f"{stats.faulted_calls}/{stats.calls} destination calls faulted "
                 f"({stats.fault_share:.1%}), {stats.kills} kills, "
                 f"{stats.relay_restarts} relay restart(s); faults off")

        if config.freeze_seconds:
            self.log(f"long-fault phase: the store frozen for {config.freeze_seconds:g}s…")
            phase = time.monotonic()
            await self._long_faults()
            self.mark("long_fault_phase_s", phase)

        self.log("settling: waiting until nothing is in flight…")
        phase = time.monotonic()
        await self._wait_quiet()
        self.mark("settle_s", phase)
        self.log(f"settled in {stats.timings['settle_s']}s; resolving the review queue…")
        phase = time.monotonic()
        await self._resolve_queue()
        self.mark("resolution_s", phase)
        self.log(f"queue resolved in {stats.timings['resolution_s']}s; checking the "
                 "settled invariants…")
        await self._tally_calls()
        rows = await chaos_runs.states_of_run(self.db, self.scope)
        stats.final_states = Counter({r["state"]: int(r["n"]) for r in rows})
        report = await check.check_invariants(
            self.db, self.stack.sandbox_url, settled=True,
            scope=self.scope if config.scope_to_run else None,
            crm_id_property=self.crm.id_property, note_actions=self.crm.note_actions,
            note_id_property=self.crm.note_id_property,
            http=self.env.http)
        report.results.append(await self._adoption(seeded))
        stats.failed_workflows = await self._failed_workflows()
        stats.timings["total_s"] = round(time.monotonic() - self.started, 1)
        return ChaosResult(config, stats, report)

    # ----- pre-existing CRM records: seeded before the run, checked after it
    async def _seed_existing(self, people: list[_Seeded]) -> list[_Seeded]:
        """Create the records a salesperson made before inboxcrm (no external ID of ours)."""
        if not people:
            return []
        first, last = zip(*(p.name.split(" ", 1) for p in people), strict=True)
        response = await self.env.http.post(
            f"{self.stack.sandbox_url}/_sandbox/seed",
            json={"crm": self.crm.name, "contacts": [
                {"email": p.email, "firstname": f, "lastname": ln, "owner": SEED_OWNER,
                 "properties": dict([self.crm.seed_field])}
                for p, f, ln in zip(people, first, last, strict=True)]})
        response.raise_for_status()
        for person, created in zip(people, response.json()["contacts"], strict=True):
            person.record_id = str(created["id"])
        self.stats.seeded = len(people)
        return people

    async def _adoption(self, seeded: list[_Seeded]) -> check.CheckResult:
        """Each seeded sender: exactly one record with the email (the seeded one), its owner
        and the salesperson's field untouched, our external ID on it once our CRM step ran
        (the contact's `crm_record_id` is set) and never another contact's."""
        result = check.CheckResult(
            "existing_records_adopted",
            "a sender already in the CRM: one record with the email, the seeded one, "
            "carrying our external ID, owner and salesperson's field untouched",
            examined=len(seeded))
        if not seeded:
            return result
        id_property = self.crm.id_property
        records: dict[str, list[dict[str, Any]]] = {}
        for record in (await self.env.sandbox_state())["contacts"]:
            email = str((record.get("properties") or {}).get("email") or "").lower()
            records.setdefault(email, []).append(record)
        rows = await chaos_runs.contacts_for_emails(self.db, tenant="acme",
                                                    emails=[p.email for p in seeded])
        ours = {r["identity"]: r for r in rows}
        field_name, field_value = self.crm.shown_field, self.crm.seed_field[1]
        for person in seeded:
            subject = f"seeded:{person.record_id}"
            held = records.get(person.email, [])
            if [str(r.get("id")) for r in held] != [person.record_id]:
                result.flag(f"{subject} records_with_email:"
                            + ",".join(sorted(str(r.get("id")) for r in held)))
                continue
            props = held[0].get("properties") or {}
            if str(props.get(self.crm.owner_field)) != SEED_OWNER:
                result.flag(f"{subject} owner_changed")
            if props.get(field_name) != field_value:
                result.flag(f"{subject} salesperson_field_changed")
            contact = ours.get(person.email)
            written = str(props.get(id_property) or "")
            if contact is None or not contact["crm_record_id"]:
                if written:
                    result.flag(f"{subject} external_id_without_our_crm_step")
                self.stats.seeded_unreached += 1
                continue
            if str(contact["crm_record_id"]) != person.record_id:
                result.flag(f"{subject} contact:{contact['contact_id']} points_elsewhere")
            elif written != contact["contact_id"]:
                result.flag(f"{subject} contact:{contact['contact_id']} external_id_missing")
            else:
                self.stats.adopted += 1
        return result

    # ----- the long-fault phase: a frozen store under a pause spanning the run
    async def _long_faults(self) -> None:
        config, stats = self.config, self.stats
        stats.in_flight_at_freeze = await self._in_flight()
        pids = postgres_pids(Path(config.store_dir)) if config.store_dir else []
        if not pids:
            stats.notes.append("store not frozen: no embedded PostgreSQL to stop "
                               "(DATABASE_URL names an external server)")
        else:
            self.log(f"  t+{time.monotonic() - self.started:.0f}s freeze the store "
                     f"(SIGSTOP {len(pids)} PostgreSQL processes) for "
                     f"{config.freeze_seconds:.0f}s; {stats.in_flight_at_freeze} items in flight")
            frozen = time.monotonic()
            signal_all(pids, signal.SIGSTOP)
            try:
                await asyncio.sleep(config.freeze_seconds)
            finally:
                signal_all(list(reversed(pids)), signal.SIGCONT)
                stats.store_frozen_s = round(time.monotonic() - frozen, 1)
            self.log(f"  t+{time.monotonic() - self.started:.0f}s store thawed")
        await self._operator("resume", "--tenant", "acme", "--scope", "send")

    async def _add_lead_reviewer(self) -> None:
        """A reviewer of acme with the role that may retry an ambiguous send; its token is
        what the run's review decisions are made with."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "inboxcrm.cli", "reviewer", "add",
            f"{self.config.reviewer}-{self.stats.run_id}", "--tenant", "acme", "--role", "lead",
            "--json", env=self.cli_env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
        if proc.returncode != 0:
            raise RuntimeError("chaos: adding its lead reviewer failed: "
                               f"{stderr.decode(errors='replace').strip()[-200:]}")
        self.review_env["INBOXCRM_REVIEWER_TOKEN"] = str(json.loads(stdout)["token"])

    async def _operator(self, *args: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "inboxcrm.cli", *args, env=self.cli_env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
        if proc.returncode != 0:
            self.stats.cli_failures += 1
            self.stats.notes.append(f"{' '.join(args[:1])} failed: "
                                    f"{stderr.decode(errors='replace').strip()[-200:]}")
        else:
            self.log(f"  t+{time.monotonic() - self.started:.0f}s inboxcrm {' '.join(args)}: "
                     f"{stdout.decode(errors='replace').strip().splitlines()[-1:]}")

    async def _failed_workflows(self) -> int:
        """This run's workflows that ended FAILED (none may: faults park, never fail)."""
        from inboxcrm.platform import temporal

        settings = self.stack.settings()
        # The namespace of the tenant this run drives (docs/architecture.md §7).
        client = await temporal.connect(settings, namespace=temporal.namespace_for_workflow(
            settings, self.scope))
        query = (f"WorkflowType = '{WORKFLOW_TYPE}' AND ExecutionStatus = 'Failed' "
                 f"AND WorkflowId STARTS_WITH '{self.scope}'")
        return len([w async for w in client.list_workflows(query)])

    # ----- ingress, like a provider: redeliver until accepted (bounded)
    async def _post_all(self, schedule: list[tuple[float, _Delivery]]) -> None:
        gate = asyncio.Semaphore(self.config.concurrency)
        start = time.monotonic()

        async def one(at: float, delivery: _Delivery) -> None:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            async with gate:
                await self._post(delivery)

        await asyncio.gather(*(one(at, d) for at, d in schedule))

    async def _post(self, delivery: _Delivery) -> None:
        delay = 0.25
        for attempt in range(self.config.post_attempts):
            if self.left() <= 0:
                break
            if attempt:
                self.stats.post_retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 1.6, 3.0)
            try:
                response = await self.env.post(delivery.raw, delivery.delivery_id)
            except httpx.TransportError:
                continue                     # relay down / connection dropped: redeliver
            if response.status_code == 200:
                body = response.json()
                self.stats.answers[str(body.get("status"))] += 1
                delivery.workflow_id = str(body.get("workflow_id"))
                return
            if response.status_code >= 500 or response.status_code == 429:
                continue
            self.stats.answers[f"http_{response.status_code}"] += 1
            self.stats.notes.append(f"{delivery.delivery_id}: HTTP {response.status_code}")
            return
        self.stats.posts_given_up += 1
        self.stats.notes.append(f"{delivery.delivery_id}: never accepted")

    # ----- faults
    async def _inject_faults(self) -> None:
        """Keep roughly `fault_ratio` of destination calls faulted: every mode at least
        once, small counts, Retry-After 1."""
        first = [(TARGETS[i % 2 * 2], mode) for i, mode in enumerate(MODES)]
        first += [("crm.search", self.rng.choice(MODES))]
        self.rng.shuffle(first)
        deadline = time.monotonic() + self.config.deadline
        while self.injecting and time.monotonic() < deadline:
            try:
                calls = await self._calls()
                pending = await self._pending_faults()
            except httpx.HTTPError:
                await asyncio.sleep(0.5)
                continue
            mine = calls[self.call_baseline:]
            total = len(mine)
            faulted = sum(1 for c in mine if c["outcome"] in MODES)
            queued = sum(pending.values())
            want = self.config.fault_ratio * (total + 5)
            if faulted + queued < want:
                room = [t for t in TARGETS if pending.get(t, 0) < MAX_PENDING[t]]
                if first and first[0][0] in room:
                    target, mode = first.pop(0)
                elif room:
                    target = self.rng.choices(room, [TARGET_WEIGHTS[t] for t in room])[0]
                    mode = self.rng.choices(MODES, [MODE_WEIGHTS[m] for m in MODES])[0]
                else:
                    target = ""
                if target:
                    try:
                        await self.env.inject(target, mode, count=self.rng.randint(1, 2),
                                              retry_after=1)
                        self.stats.faults_injected[f"{target}/{mode}"] += 1
                    except httpx.HTTPError:
                        pass
                    continue
            await asyncio.sleep(0.4)

    async def _calls(self) -> list[dict[str, Any]]:
        """Every destination call the sandbox logged (outcome labels only, no bodies)."""
        response = await self.env.http.get(f"{self.stack.sandbox_url}/_sandbox/calls")
        response.raise_for_status()
        return list(response.json()["calls"])

    async def _pending_faults(self) -> dict[str, int]:
        response = await self.env.http.get(f"{self.stack.sandbox_url}/_sandbox/faults")
        response.raise_for_status()
        pending: Counter[str] = Counter()
        for fault in response.json().get("faults", []):
            pending[fault["target"]] += int(fault["remaining"])
        return dict(pending)

    async def _tally_calls(self) -> None:
        mine = (await self._calls())[self.call_baseline:]
        self.stats.calls = len(mine)
        self.stats.fault_outcomes = Counter(
            f"{c['target']}/{c['outcome']}" for c in mine if c["outcome"] in MODES)
        self.stats.faulted_calls = sum(self.stats.fault_outcomes.values())

    # ----- process crashes
    async def _disrupt(self, window: float, posting: float) -> None:
        """Worker kill -9s spread over the whole window; relay restarts while deliveries are
        still pouring in (so some of them fail and are redelivered)."""
        await asyncio.gather(self._kill_workers(window), self._restart_relay(posting))

    def _worker_names(self) -> list[str]:
        return [worker_name(index) for index in range(1, self.config.workers + 1)]

    async def _start_workers(self) -> None:
        """The run's worker processes: the stack's own and as many more as the config asks
        for, side by side on the one task queue (the design's crash tests with parallel
        workers: a kill lands on one while the other carries on)."""
        for index, name in enumerate(self._worker_names(), start=1):
            proc = self.stack.processes.get(name)
            if proc is None or not proc.alive():
                await asyncio.to_thread(self.stack.start_worker, index)

    async def _kill_workers(self, window: float) -> None:
        slots = self.config.kills + 1
        # Each worker is killed in turn, in a random order: at random, yet spread over all.
        names = self._worker_names()
        victims = [names[n % len(names)] for n in range(self.config.kills)]
        self.rng.shuffle(victims)
        start = time.monotonic()
        for n, name in enumerate(victims, start=1):
            at = window * (n + self.rng.uniform(-0.3, 0.3)) / slots
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            worker = self.stack.processes[name]
            self.log(f"  t+{time.monotonic() - self.started:.0f}s kill -9 {name} "
                     f"(pid {worker.pid})")
            await asyncio.to_thread(worker.kill)
            self.stats.kills += 1
            self.stats.kills_by_worker[name] += 1
            await asyncio.sleep(self.rng.uniform(0.2, 2.0))
            await asyncio.to_thread(self.stack.restart, name)

    async def _restart_relay(self, posting: float) -> None:
        start = time.monotonic()
        for _ in range(self.config.relay_restarts):
            at = posting * self.rng.uniform(0.25, 0.75)
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            self.log(f"  t+{time.monotonic() - self.started:.0f}s restart relay")
            await asyncio.to_thread(self.stack.processes["relay"].stop)
            await asyncio.sleep(self.rng.uniform(0.5, 1.5))
            await asyncio.to_thread(self.stack.start_relay)
            self.stats.relay_restarts += 1
            start = time.monotonic()

    async def _ensure_running(self) -> None:
        await self._start_workers()
        if not self.stack.processes["relay"].alive():
            await asyncio.to_thread(self.stack.start_relay)

    # ----- settling
    async def _in_flight(self) -> int:
        return await chaos_runs.count_in_states(self.db, self.scope,
                                                 sorted(check.IN_FLIGHT_STATES))

    async def _wait_quiet(self) -> bool:
        # After a long outage an item may sleep one store-wait step (up to STORE_WAIT_MAX).
        settle = self.config.settle_timeout + (STORE_WAIT_MAX.total_seconds()
                                               if self.config.freeze_seconds else 0.0)
        deadline = time.monotonic() + min(settle, max(self.left(), 1.0))
        quiet_since: float | None = None
        next_report = time.monotonic() + 15
        while time.monotonic() < deadline:
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + 15
                await self._log_in_flight()
            if await self._in_flight() == 0:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= 1.0:   # stays quiet for a moment
                    return True
            else:
                quiet_since = None
            await asyncio.sleep(0.5)
        self.stats.notes.append(f"still {await self._in_flight()} in flight after waiting")
        return False

    async def _log_in_flight(self) -> None:
        rows = await chaos_runs.in_flight_by_state(self.db, self.scope,
                                                    sorted(check.IN_FLIGHT_STATES))
        self.log(f"  t+{time.monotonic() - self.started:.0f}s in flight: " + ("; ".join(
            f"{r['n']} {r['state']}{'(' + r['reason'] + ')' if r['reason'] else ''}"
            f" ops[{r['ops'] or '-'}]" for r in rows) or "none"))

    # ----- the operator
    async def _review_items(self) -> list[asyncpg.Record]:
        return await chaos_runs.review_items(self.db, self.scope, sorted(check.REVIEW_STATES))

    async def _resolve_queue(self) -> None:
        approvals: Counter[str] = Counter()
        gate = asyncio.Semaphore(self.config.cli_concurrency)

        async def act(item: asyncpg.Record, decision: tuple[str, str | None]) -> None:
            async with gate:
                await self._review(item["workflow_id"], *decision)

        for round_no in range(1, self.config.resolve_rounds + 1):
            items = await self._review_items()
            if not items or self.left() <= 0:
                break
            self.stats.resolution_rounds = round_no
            destination = await self.env.sandbox_state()
            refs = await self._operation_refs(items)
            decisions = [self._decide(item, destination, refs, approvals, round_no)
                         for item in items]
            began = time.monotonic()
            await asyncio.gather(*(act(i, d) for i, d in zip(items, decisions, strict=True)))
            signalled = time.monotonic()
            await self._wait_moved(items)
            moved = time.monotonic()
            await self._wait_quiet()
            self.log(f"  review round {round_no}: " + ", ".join(
                f"{n} {a}" for a, n in sorted(Counter(d[0] for d in decisions).items()))
                + f" (CLI {signalled - began:.0f}s, applied {moved - signalled:.0f}s, "
                f"settled {time.monotonic() - moved:.0f}s)")
        self.stats.review_left = len(await self._review_items())

    async def _operation_refs(self, items: list[asyncpg.Record]
                              ) -> dict[str, tuple[str, str, str, str]]:
        """op_key → (op_key, action, external reference, last error) for the operations
        items wait on."""
        keys = [i["destination_ref"] for i in items if i["destination_ref"]]
        rows = await chaos_runs.operation_refs(self.db, keys) if keys else []
        return {r["op_key"]: (r["op_key"], r["action"], r["external_ref"] or "",
                              r["last_error"] or "") for r in rows}

    def _decide(self, item: asyncpg.Record, destination: dict[str, Any],
                refs: dict[str, tuple[str, str, str, str]], approvals: Counter[str],
                round_no: int) -> tuple[str, str | None]:
        state, workflow_id = item["state"], item["workflow_id"]
        if state == "blocked":
            return Decision.RETRY, None
        if state == "ambiguous":
            op_key = item["destination_ref"] or ""
            ref = refs.get(op_key)
            found = self._find_at_destination(ref, destination)
            if found:
                return Decision.RESOLVE, found
            if ref is not None and ref[3].startswith(UNCONFIRMED_THEN):
                # Not at the provider, and the person opted out since: a retry would hold
                # again (the card says so); no follow-up is the decision.
                return Decision.REJECT, None
            return Decision.RETRY, None
        reason = str(item["reason"] or "")
        if reason in ("no_identity", "candidates") or approvals[workflow_id] >= 2 \
                or round_no >= self.config.resolve_rounds - 1:
            return Decision.REJECT, None
        roll = self.rng.random()
        if state == "awaiting_review" and roll < 0.2:
            return Decision.HOLD, None
        if roll > 0.9:
            return Decision.REJECT, None
        approvals[workflow_id] += 1
        return Decision.APPROVE, None

    def _find_at_destination(self, ref: tuple[str, str, str, str] | None,
                             destination: dict[str, Any]) -> str | None:
        """The record or email the unconfirmed side effect may have created."""
        if ref is None:
            return None
        op_key, action, external_ref, _ = ref
        if action == "crm-upsert":
            for record in destination["contacts"]:
                props = record.get("properties") or {}
                if str(props.get(self.crm.id_property)) == external_ref:
                    return str(record["id"])
        elif action in ("crm-note", "crm-email", "crm-sent"):
            # The note and the conversation's email activities, keyed alike (`note_key`):
            # by a property of theirs, or (Pipedrive's notes, which have none) in the text.
            from inboxcrm.activities.crm import note_key
            from inboxcrm.adapters.pipedrive import NOTE_MARK
            key = note_key(op_key)
            for note in destination.get("notes", []):
                props = note.get("properties") or {}
                if key in props.values() or (
                        self.crm.name == "pipedrive"
                        and f"{NOTE_MARK}{key}<" in str(props.get("hs_note_body") or "")):
                    return str(note["id"])
            for logged in destination.get("activities", []):
                if key in (logged.get("key") or {}).values():
                    return str(logged["id"])
        elif action == "send":
            for message in destination["emails"]:
                if message.get("idempotency_key") == external_ref:
                    return str(message["id"])
        return None

    async def _review(self, workflow_id: str, action: str, evidence: str | None) -> None:
        argv = [sys.executable, "-m", "inboxcrm.cli", "review", action, workflow_id,
                "--reviewer", self.config.reviewer, "--note", f"chaos run {self.stats.run_id}"]
        if evidence:
            argv += ["--evidence", evidence]
        proc = await asyncio.create_subprocess_exec(
            *argv, env=self.review_env, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            stderr = b"timeout"
        if proc.returncode == 0:
            self.stats.review_actions[action] += 1
        else:
            self.stats.cli_failures += 1
            self.stats.notes.append(f"review {action} {workflow_id} failed: "
                                    f"{stderr.decode(errors='replace').strip()[-200:]}")

    async def _wait_moved(self, items: list[asyncpg.Record], timeout: float = 60.0) -> None:
        """Until each signalled item has changed state (or its signal was refused), so a
        decision is never sent twice for one wait."""
        marks = {i["workflow_id"]: i["updated_at"] for i in items}
        deadline = time.monotonic() + timeout
        while marks and time.monotonic() < deadline:
            rows = await chaos_runs.moved_since(self.db, list(marks), list(marks.values()))
            for row in rows:
                if row["moved"] or row["refused"]:
                    marks.pop(row["workflow_id"], None)
            await asyncio.sleep(0.3)
        if marks:
            self.stats.notes.append(f"{len(marks)} signalled items did not move in {timeout:.0f}s")


async def run_chaos(stack: Stack, config: ChaosConfig, log: Log | None = None) -> ChaosResult:
    """Run the chaos scenario against a started stack whose worker and relay processes this
    caller owns (it kills and restarts them, and leaves them running)."""
    return await ChaosRun(stack, config, log or (lambda _line: None)).run()


# --- a fresh stack of its own (`make chaos`) ---------------------------------------------
def fresh_stack_config(data_dir: Path, database_url: str, workers: int = 1,
                       crm: str = "hubspot") -> Any:
    """A stack of its own; with `crm` other than the sandbox's HubSpot, its tenants write
    to that CRM's surface of the stack's sandbox (`crm_env`)."""
    from inboxcrm.stack.stack import isolated_config

    config = isolated_config(data_dir, database_url, queue_prefix="inboxcrm-chaos",
                             temporal_address=os.environ.get("TEMPORAL_ADDRESS") or None,
                             workers=workers)
    config.extra_env.update(crm_env(crm, f"http://127.0.0.1:{config.sandbox_port}"))
    return config


async def _create_database(server_url: str) -> str:
    return await postgres.create_database(server_url, "inboxcrm_chaos")


async def _drop_database(server_url: str, database_url: str) -> None:
    await postgres.drop_database(server_url, database_url)


def postgres_pids(data_dir: Path) -> list[int]:
    """The postmaster of the server under `data_dir`, then its children (Linux /proc)."""
    try:
        postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == postmaster:
                children.append(int(stat.parent.name))
    return [postmaster, *children]


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def run_on_fresh_stack(config: ChaosConfig, data_dir: Path, log: Log,
                       keep_database: bool = False) -> ChaosResult:
    """Start a stack of its own under `data_dir` (free ports; a fresh database in
    $DATABASE_URL's server, else in an embedded PostgreSQL under data_dir), run, stop."""
    from inboxcrm.stack import postgres
    from inboxcrm.stack.processes import free_port

    data_dir.mkdir(parents=True, exist_ok=True)
    server_url = os.environ.get("DATABASE_URL") or ""
    started_pg = False
    if not server_url:
        pg_dir = data_dir / "pg"
        started_pg = not postgres.is_running(pg_dir)
        server_url = postgres.start(pg_dir, free_port())
        config.store_dir = str(pg_dir)
    database_url = asyncio.run(_create_database(server_url))
    stack = Stack(fresh_stack_config(data_dir, database_url, config.workers, config.crm))
    result: ChaosResult | None = None
    try:
        log(f"starting a fresh stack under {data_dir} (logs in {stack.log_dir})")
        stack.start_all()
        result = asyncio.run(run_chaos(stack, config, log))
        return result
    finally:
        stack.stop()
        if result is not None and (result.report.ok or not keep_database):
            asyncio.run(_drop_database(server_url, database_url))
        elif result is not None:
            log(f"database kept for inspection: {database_url}")
        if started_pg:
            postgres.stop(data_dir / "pg")


# --- output --------------------------------------------------------------------------------
def summary_rows(result: ChaosResult) -> list[tuple[str, str]]:
    s = result.stats
    rows = [
        ("run", s.run_id),
        ("deliveries (distinct)", str(s.deliveries)),
        ("posts (incl. redeliveries)", f"{s.posts} ({s.redeliveries} redeliveries)"),
        ("same-identity collisions", str(s.collisions)),
        ("opt-outs / auto-replies", f"{s.opt_outs} / {s.auto_replies}"),
        ("already in the CRM: seeded / adopted / not reached",
         f"{s.seeded} / {s.adopted} / {s.seeded_unreached}"),
        ("relay answers", _counts(s.answers)),
        ("post retries (503 / connection)", str(s.post_retries)),
        ("deliveries never accepted", str(s.posts_given_up)),
        ("destination calls", str(s.calls)),
        ("calls that saw a fault", f"{s.faulted_calls} of {s.calls}; while faults were on: "
                                   f"{s.phase_faulted_calls} of {s.phase_calls} "
                                   f"({s.fault_share:.1%})"),
        ("fault modes seen", _counts(Counter(k.split("/")[1] for k in s.fault_outcomes
                                             for _ in range(s.fault_outcomes[k])))),
        ("faults injected (target/mode)", str(sum(s.faults_injected.values()))),
        ("worker kill -9 / restarts", f"{s.kills} / {s.kills} "
                                      f"({_counts(s.kills_by_worker)})"),
        ("relay restarts", str(s.relay_restarts)),
        ("long faults: store frozen (s) / items in flight",
         f"{s.store_frozen_s} / {s.in_flight_at_freeze}"
         + (" (sends paused over the run)" if s.paused_over_run else "")),
        ("failed workflows", str(s.failed_workflows)),
        ("review actions (CLI)", _counts(s.review_actions) or "none"),
        ("CLI failures", str(s.cli_failures)),
        ("resolution rounds", str(s.resolution_rounds)),
        ("left in review queue", str(s.review_left)),
        ("final states", _counts(s.final_states)),
        ("timings (s)", ", ".join(f"{k}={v}" for k, v in s.timings.items())),
    ]
    for name, examined, violations, note in check.summary_rows(result.report):
        rows.append((f"check {name}", f"examined {examined or '-'}, violations {violations}"
                     + ("" if note in ("ok", "none") else f" ({note})")))
    verdict = "PASS" if result.exit_code == 0 else (
        "VIOLATIONS" if result.exit_code == 1 else "INCOMPLETE: " + "; ".join(result.targets_met))
    rows.append(("result", verdict))
    return rows


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items()))


def format_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    lines = [f"{'metric'.ljust(width)} | value", f"{'-' * width}-+-{'-' * 40}"]
    lines += [f"{k.ljust(width)} | {v}" for k, v in rows]
    return "\n".join(lines)
