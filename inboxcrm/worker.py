"""The worker process: runs InboundEmailWorkflow, the scheduled DriftCheckWorkflow,
ReviewNoticesWorkflow, ConsentSyncWorkflow and RetentionWorkflow, the mailbox watchers, and
every activity on one task queue; with the LLM extractor, also the
model call on a task queue of its own, rate-limited (docs/architecture.md §5).

Stateless: any number of replicas may run; PostgreSQL constraints and the operation keys,
not the worker, decide what is a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import uvloop
from temporalio.worker import (
    FixedSizeSlotSupplier,
    ResourceBasedSlotConfig,
    ResourceBasedSlotSupplier,
    ResourceBasedTunerConfig,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkerTuner,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from inboxcrm.activities.bookkeeping import BookkeepingActivities
from inboxcrm.activities.consent import ConsentActivities
from inboxcrm.activities.crm import CrmActivities
from inboxcrm.activities.drift import DriftActivities
from inboxcrm.activities.extract import ExtractActivities
from inboxcrm.activities.mailbox_gmail import gmail_activities
from inboxcrm.activities.mailbox_graph import graph_activities
from inboxcrm.activities.mailbox_imap import mailbox_activities
from inboxcrm.activities.match import MatchActivities
from inboxcrm.activities.notify import NoticeActivities
from inboxcrm.activities.outbox import MAX_PARK_SECONDS
from inboxcrm.activities.retention import RetentionActivities
from inboxcrm.activities.review import ReviewActivities
from inboxcrm.activities.send import SendActivities
from inboxcrm.activities.shadow import ShadowActivities
from inboxcrm.activities.store_outage import StoreOutageInterceptor
from inboxcrm.adapters.base import AdapterError, CrmClient, MailClient
from inboxcrm.adapters.factory import ConfigurationError, Destinations
from inboxcrm.domain.extraction import Extractor, build_extractor, work_pool
from inboxcrm.domain.extraction.rules import RulesExtractor
from inboxcrm.domain.policy import (
    PolicyError,
    UnknownTenant,
    current_policies,
    destinations_audit,
    get_policy,
)
from inboxcrm.domain.shadow import comparison_extractor
from inboxcrm.platform import atrest, temporal, tracing
from inboxcrm.platform.call_budget import CallBudget
from inboxcrm.platform.codec import KeyFileError
from inboxcrm.platform.config import InsecureSetting, Settings, get_settings
from inboxcrm.platform.gmail_config import GmailSettings
from inboxcrm.platform.logs import configure_logging
from inboxcrm.platform.workpool import IN_PROCESS, Runner
from inboxcrm.schemas.destinations import TenantDestinations
from inboxcrm.store import audit, db, worker_destinations
from inboxcrm.store.roles import role_of
from inboxcrm.workflows.consent_sync import ConsentSyncWorkflow
from inboxcrm.workflows.drift_check import DriftCheckWorkflow
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow
from inboxcrm.workflows.mailbox_gmail import GmailWatchWorkflow
from inboxcrm.workflows.mailbox_graph import GraphMailboxWorkflow
from inboxcrm.workflows.mailbox_watch import MailboxWatchWorkflow
from inboxcrm.workflows.retention import RetentionWorkflow
from inboxcrm.workflows.review_notices import ReviewNoticesWorkflow

log = logging.getLogger("inboxcrm.worker")

# The worker's PostgreSQL pool. Every step is a local activity holding at most one of its
# connections at a time, so the worker runs at most this many local activities at once
# (docs/architecture.md §5): more would only queue on the pool inside their step's timeout,
# where a wait looks like a hung store. The SDK's default is 100 slots.
DB_POOL_SIZE = 20
MAX_CONCURRENT_LOCAL_ACTIVITIES = DB_POOL_SIZE


def tenant_destinations(settings: Settings) -> Destinations:
    """Each tenant's CRM and mail accounts, from its policy's `destinations` (the global
    settings for a tenant that names none; docs/architecture.md §5)."""

    def lookup(tenant: str) -> TenantDestinations:
        try:
            return get_policy(tenant).destinations
        except (UnknownTenant, PolicyError) as exc:
            # Never another account: a tenant whose policy cannot be read has no destination.
            raise ConfigurationError(str(exc)) from None

    return Destinations(settings, lookup)


def activity_functions(pool: asyncpg.Pool, crm: CrmClient | Destinations,
                       mail: MailClient | None, extractor: Extractor, max_retry_after: float,
                       review_base_url: str = "", decision_secret: str | None = None,
                       comparison: Extractor | None = None, max_park: float = MAX_PARK_SECONDS,
                       model_queue: str = "", settings: Settings | None = None,
                       runner: Runner = IN_PROCESS) -> list[Callable[..., Any]]:
    """Every activity InboundEmailWorkflow runs on its task queue, bound to its resources.
    `crm`: each tenant's accounts (`Destinations`), or one CRM client (with `mail`) for
    every tenant. `comparison` is the second extractor shadowed items are also shown to
    (`inboxcrm.domain.shadow`); `model_queue`: the model call runs there instead
    (`model_activities`); `settings`: the send's (default: the process's); `runner`: where the
    work on a message runs (the worker's `WorkPool`)."""
    destinations = crm if isinstance(crm, Destinations) else Destinations.fixed(crm, mail)
    extract = ExtractActivities(pool, extractor, max_retry_after, review_base_url,
                                model_queue, runner)
    match = MatchActivities(pool)
    crm_acts = CrmActivities(pool, destinations, max_retry_after, max_park, settings)
    send = SendActivities(pool, destinations, max_retry_after, settings, max_park)
    # Unproven decisions are refused by what the process runs under (production, unless
    # Temporal authorises decisions itself); a test's activities without settings record.
    bookkeeping = BookkeepingActivities(
        pool, decision_secret,
        refuse_unproven=settings is not None and settings.refuses_unproven_decisions)
    review = ReviewActivities(pool)
    # A second extractor that calls a model runs inside the local shadow step, out of the
    # model queue's sight: it gets this process's share of the same rate instead.
    model_budget = (CallBudget((settings or get_settings()).model_calls_per_second)
                    if comparison is not None and not isinstance(comparison, RulesExtractor)
                    else None)
    shadow = ShadowActivities(pool, comparison, runner, model_budget)
    return [
        extract.extract_message,
        match.match_and_plan,
        crm_acts.upsert_contact_in_crm,
        crm_acts.log_email_on_contact,
        crm_acts.log_inbound_email_in_crm,
        crm_acts.log_followup_in_crm,
        send.submit_followup_email,
        bookkeeping.record_item_state,
        bookkeeping.record_audit,
        bookkeeping.record_decision,
        bookkeeping.mark_review_escalated,
        review.resolve_operation,
        review.grant_operation_retry,
        review.send_followup_again,
        review.apply_review_corrections,
        review.approve_followup_intent,
        review.decline_followup_intent,
        review.describe_operation,
        shadow.plan_in_shadow,
    ]


def model_activities(pool: asyncpg.Pool, extractor: Extractor, max_retry_after: float,
                     review_base_url: str = "", runner: Runner = IN_PROCESS
                     ) -> list[Callable[..., Any]]:
    """The activity of the model's task queue: the extraction with the LLM."""
    extract = ExtractActivities(pool, extractor, max_retry_after, review_base_url,
                                runner=runner)
    return [extract.extract_with_model]


def model_queue(settings: Settings, extractor: Extractor) -> str:
    """The model's task queue, or "" for an extractor that runs locally (the rules)."""
    if extractor.name != "llm":
        return ""
    return settings.model_task_queue or f"{settings.task_queue}-model"


def workflow_runner(settings: Settings) -> WorkflowRunner:
    """Unsandboxed unless INBOXCRM_WORKFLOW_SANDBOX=true.

    The sandbox re-executes `inboxcrm/workflows/inbound_email.py` and proxies every import for each
    workflow run; measured by `make bench`'s profile that is about 15 ms of CPU per item, a
    sixth of everything an item costs. What it guards against (a clock, randomness, I/O or
    shared module state inside workflow code) is guarded here by other means: `workflows/`
    holds orchestration only and imports its helpers as passthrough modules that keep no
    state (`.importlinter`, docs/architecture.md §9), and `tests/test_replay.py` replays the
    live and stored histories through the SDK's Replayer, which runs the sandbox with its
    restrictions (a forbidden call fails there). Set INBOXCRM_WORKFLOW_SANDBOX=true to run
    production workers sandboxed anyway (e.g. while changing workflow code)."""
    if settings.workflow_sandbox:
        return SandboxedWorkflowRunner()
    return UnsandboxedWorkflowRunner()


def slot_options(settings: Settings) -> dict[str, Any]:
    """How many tasks of each kind a worker runs at once: fixed counts, or item slots that
    follow the machine's CPU (`INBOXCRM_WORKFLOW_TASK_TARGET_CPU`, docs/capacity.md)."""
    if not settings.workflow_task_target_cpu:
        return {"max_concurrent_activities": settings.max_concurrent_activities,
                "max_concurrent_workflow_tasks": settings.max_concurrent_workflow_tasks,
                "max_concurrent_local_activities": MAX_CONCURRENT_LOCAL_ACTIVITIES}
    items = ResourceBasedSlotSupplier(
        ResourceBasedSlotConfig(
            minimum_slots=min(settings.min_concurrent_workflow_tasks,
                              settings.max_concurrent_workflow_tasks),
            maximum_slots=settings.max_concurrent_workflow_tasks,
            # A new item's CPU shows only once its steps run: without a pause the supplier
            # would hand out every slot before its first measurement.
            ramp_throttle=timedelta(milliseconds=100)),
        ResourceBasedTunerConfig(target_memory_usage=0.9,
                                 target_cpu_usage=settings.workflow_task_target_cpu))
    return {"tuner": WorkerTuner.create_composite(
        workflow_supplier=items,
        activity_supplier=FixedSizeSlotSupplier(settings.max_concurrent_activities),
        local_activity_supplier=FixedSizeSlotSupplier(MAX_CONCURRENT_LOCAL_ACTIVITIES),
        nexus_supplier=FixedSizeSlotSupplier(1))}


def worker_options(settings: Settings) -> dict[str, Any]:
    """The worker's limits, cache and workflow runner: shared with the benchmark's engine
    floor (`bench/floor_worker.py`), so that product and floor differ in work, not in
    configuration."""
    return {
        **slot_options(settings),
        # Items parked for review wait for days: keep a bounded number in memory; an evicted
        # one replays its (short) history when its signal arrives.
        "max_cached_workflows": settings.max_cached_workflows,
        "workflow_runner": workflow_runner(settings),
        # A rollout drains (docs/architecture.md §4): the steps in flight (local activities,
        # an SMTP send among them) always run to their end; no new step or destination call
        # starts (`inboxcrm/activities/outbox.py`, `inboxcrm/activities/step_attempts.py`).
        # This grace is what
        # regular activities get before they are cancelled: the drift check, and the steps
        # of workflows started before `local-steps`.
        "graceful_shutdown_timeout": timedelta(seconds=settings.shutdown_grace_seconds),
    }


DESTINATION_AUDIT_SECONDS = 5.0


async def audit_destination_changes(pool: asyncpg.Pool, stop: asyncio.Event,
                                    interval: float = DESTINATION_AUDIT_SECONDS) -> None:
    """A policy change that touches a tenant's destinations is audited
    (`destinations_changed`: fingerprint, providers, hosts, secret locations), once, by
    whichever worker sees it first; a policy that fails to load changes nothing."""
    while not stop.is_set():
        try:
            policies = current_policies()
            async with pool.acquire() as conn:
                for tenant, policy in sorted(policies.items()):
                    detail, empty = destinations_audit(policy)
                    if await audit.record_destinations(conn, tenant=tenant, actor="policy",
                                                       detail=detail, empty=empty):
                        log.info("tenant %s: destinations changed (audited)", tenant)
        except Exception as exc:  # a bad policy or a store outage: try again later
            log.warning("destination audit skipped: %s", type(exc).__name__)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)


def worker_identity() -> str:
    """This process among the workers (host, pid and a random part: a pid is reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def report_destinations(pool: asyncpg.Pool, destinations: Destinations, worker_id: str,
                              task_queue: str, stop: asyncio.Event,
                              interval: float = worker_destinations.REPORT_SECONDS) -> None:
    """What this worker would call, per tenant (providers and base URLs; migration 079),
    refreshed every `interval` and deleted at a graceful stop: `inboxcrm rehearse` asks
    the workers, not its own environment, whether they point at the sandbox."""
    started_at = datetime.now(UTC)
    try:
        while not stop.is_set():
            try:
                rows = [(e.tenant, e.crm_provider, e.crm_url, e.mail_provider, e.mail_url)
                        for e in map(destinations.endpoints, sorted(current_policies()))]
                async with pool.acquire(timeout=interval) as conn:
                    await asyncio.wait_for(worker_destinations.report(
                        conn, worker_id=worker_id, task_queue=task_queue,
                        started_at=started_at, tenants=rows), timeout=interval)
            except Exception as exc:  # a bad policy or a store outage: try again later
                log.warning("destination report skipped: %s", type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
    finally:
        # A frozen store must not hold the exit: the report then ages out instead.
        with contextlib.suppress(Exception):
            async with pool.acquire(timeout=interval) as conn:
                await asyncio.wait_for(worker_destinations.forget(conn, worker_id=worker_id),
                                       timeout=interval)


async def take_tenants_live(destinations: Destinations, tenants: list[str]) -> list[str]:
    """Each tenant's CRM checked before its first item (`inboxcrm crm check`): one whose
    external ID field is missing, not unique or not an external ID is refused, as
    `hubspot-setup` refuses a non-unique property (docs/architecture.md §5). A CRM that
    cannot be reached now is not refused: its items meet the usual retries. Returns the
    refused tenants."""
    refused = []
    for tenant in tenants:
        try:
            checks = await destinations.check_guarantees(tenant)
        except ConfigurationError:
            continue  # its items are blocked as `destination_config` already
        except AdapterError as exc:
            log.warning("tenant %s: CRM guarantee not checked (%s)", tenant, exc)
            continue
        problems = [c.problem for c in checks if c.problem]
        if problems:
            refused.append(tenant)
            log.error("tenant %s not taken live: %s", tenant, "; ".join(problems))
    return refused


async def run_worker(settings: Settings, stop: asyncio.Event) -> None:
    # One connection; a client per namespace served on it (docs/architecture.md §7,
    # Namespaces): the shared one (the product's Schedules) and each tenant's own.
    tenants = sorted(current_policies())
    temporal.tenant_namespaces(settings).check(tenants)
    shared = await temporal.connect(
        settings, runtime=temporal.metrics_runtime(settings.worker_metrics_address))
    clients = [temporal.in_namespace(shared, namespace)
               for namespace in temporal.worker_namespaces(settings, tenants)]
    for client in clients:
        await temporal.ensure_search_attributes(client, client.namespace)
    pool = await db.create_pool(settings.database_url, max_size=DB_POOL_SIZE,
                                role=role_of("worker", settings.db_role))
    # The work on messages runs in child processes with a hard time limit, never on this
    # event loop (docs/architecture.md §7): started before the first task, closed after the
    # last step in flight has finished.
    work = work_pool(settings, settings.work_processes)
    await work.start()
    destinations = tenant_destinations(settings)
    # The global accounts are built now: incomplete INBOXCRM_CRM_* / INBOXCRM_MAIL_*
    # settings stop the worker at start, as before; tenants' own are built on first use.
    destinations.global_crm()
    destinations.global_mail()
    await take_tenants_live(destinations, tenants)
    extractor = build_extractor(settings)
    models = model_queue(settings, extractor)
    activities: list[Callable[..., Any]] = [
        *activity_functions(pool, destinations, None, extractor,
                            settings.max_retry_after_seconds, settings.public_relay_base_url,
                            settings.decision_secret.get_secret_value()
                            if settings.decision_secret else None,
                            comparison_extractor(settings),
                            settings.max_park_seconds, models, settings, work),
        DriftActivities(pool, destinations).check_destination_drift,
        NoticeActivities(pool, settings.public_relay_base_url,
                         settings.http_timeout_seconds).send_review_notices,
        ConsentActivities(pool, destinations).sync_consent_writes,
        RetentionActivities(pool).apply_retention,
        *mailbox_activities(pool, settings.database_url, settings.max_body_bytes,
                            role_of("worker", settings.db_role)),
        *gmail_activities(pool, GmailSettings().resolved(settings), settings.max_body_bytes),
        *graph_activities(pool, settings.max_body_bytes,
                          f"{settings.public_relay_base_url}/v1/inbound/graph")]
    # The same workflows and activities (one set of instances: one pool, one work pool) on
    # the same task queues in every namespace served; an activity's `activity.client()` is
    # its namespace's, so what a tenant's watcher starts stays in that tenant's namespace.
    workers = [Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[InboundEmailWorkflow, DriftCheckWorkflow, ReviewNoticesWorkflow,
                   MailboxWatchWorkflow, ConsentSyncWorkflow, RetentionWorkflow,
                   GmailWatchWorkflow, GraphMailboxWorkflow],
        activities=activities,
        # A PostgreSQL outage is reported as `StoreUnavailable` by every activity.
        interceptors=[StoreOutageInterceptor()],
        **worker_options(settings),
    ) for client in clients]
    # The model call: regular activities on their own queue, at most model_calls_per_second
    # for all workers together (the server enforces it), model_max_concurrent per worker.
    model_workers = [] if not models else [Worker(
        client, task_queue=models,
        activities=model_activities(pool, extractor, settings.max_retry_after_seconds,
                                    settings.public_relay_base_url, work),
        max_concurrent_activities=settings.model_max_concurrent,
        max_task_queue_activities_per_second=settings.model_calls_per_second,
        interceptors=[StoreOutageInterceptor()],
        graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace_seconds),
    ) for client in clients]
    try:
        async with contextlib.AsyncExitStack() as running:
            for each in (*workers, *model_workers):
                await running.enter_async_context(each)
            if model_workers:
                log.info("model calls on task queue %s (%s/s per namespace)", models,
                         settings.model_calls_per_second)
            log.info("worker running on task queue %s in namespace(s) %s",
                     settings.task_queue, ", ".join(c.namespace for c in clients))
            await asyncio.gather(
                audit_destination_changes(pool, stop),
                report_destinations(pool, destinations, worker_identity(),
                                    settings.task_queue, stop))
            # Every worker drains at once. Left to the exit stack, the model worker would
            # finish its call while the item worker still took new tasks, and the step after
            # the extraction would start on a draining process (tests/test_worker_exits.py).
            await asyncio.gather(*(each.shutdown() for each in (*workers, *model_workers)))
    finally:
        await destinations.aclose()
        await work.close()
        await pool.close()


def main() -> None:
    configure_logging("worker")
    tracing.configure("inboxcrm-worker")  # off unless OTEL_* asks (docs/architecture.md §8)
    try:
        atrest.require_sealer(get_settings())
    except (InsecureSetting, KeyFileError) as exc:
        # a weak credential, a missing sender, no at-rest key in production: one line, exit 2
        logging.getLogger("inboxcrm.worker").error("inboxcrm worker: %s", exc)
        raise SystemExit(2) from None
    stop = asyncio.Event()

    async def _main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(get_settings(), stop)

    # uvloop: the worker's event loop carries every activity's sockets (PostgreSQL, HTTP).
    uvloop.run(_main())


if __name__ == "__main__":
    main()
