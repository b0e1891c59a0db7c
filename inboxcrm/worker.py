"""The worker process: runs InboundEmailWorkflow, the scheduled DriftCheckWorkflow and every
activity on one task queue.

Stateless: any number of replicas may run; PostgreSQL constraints and the operation keys,
not the worker, decide what is a duplicate.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import asyncpg
import uvloop
from temporalio.worker import Worker

from activities.bookkeeping import BookkeepingActivities
from activities.crm import CrmActivities
from activities.drift import DriftActivities
from activities.extract import ExtractActivities
from activities.match import MatchActivities
from activities.review import ReviewActivities
from activities.send import SendActivities
from activities.store_outage import StoreOutageInterceptor
from inboxcrm.adapters.base import CrmClient, MailClient
from inboxcrm.adapters.factory import build_crm, build_mail
from inboxcrm.domain.extraction import Extractor, build_extractor, work_pool
from inboxcrm.platform import temporal
from inboxcrm.platform.config import Settings, get_settings
from inboxcrm.platform.logs import configure_logging
from inboxcrm.platform.workpool import IN_PROCESS, Runner
from inboxcrm.store import db
from workflows.drift_check import DriftCheckWorkflow
from workflows.inbound_email import CRM_MAX_ATTEMPTS, SEND_MAX_ATTEMPTS, InboundEmailWorkflow

log = logging.getLogger("inboxcrm.worker")


def activity_functions(pool: asyncpg.Pool, crm: CrmClient, mail: MailClient,
                       extractor: Extractor, max_retry_after: float,
                       review_base_url: str = "",
                       runner: Runner = IN_PROCESS) -> list[Callable[..., Any]]:
    """Every activity InboundEmailWorkflow runs, bound to its resources (`runner`: where
    the work on a message runs, the worker's `WorkPool`)."""
    extract = ExtractActivities(pool, extractor, max_retry_after, review_base_url, runner)
    match = MatchActivities(pool, CRM_MAX_ATTEMPTS, SEND_MAX_ATTEMPTS)
    crm_acts = CrmActivities(pool, crm, max_retry_after)
    send = SendActivities(pool, mail, max_retry_after)
    bookkeeping = BookkeepingActivities(pool)
    review = ReviewActivities(pool)
    return [
        extract.extract_message,
        match.match_and_plan,
        crm_acts.upsert_contact_in_crm,
        crm_acts.log_email_on_contact,
        send.submit_followup_email,
        bookkeeping.record_item_state,
        bookkeeping.record_audit,
        bookkeeping.mark_review_escalated,
        review.resolve_operation,
        review.grant_operation_retry,
        review.apply_review_corrections,
        review.approve_followup_intent,
        review.decline_followup_intent,
        review.describe_operation,
    ]


async def run_worker(settings: Settings, stop: asyncio.Event) -> None:
    client = await temporal.connect(
        settings, runtime=temporal.metrics_runtime(settings.worker_metrics_address))
    await temporal.ensure_search_attributes(client, settings.temporal_namespace)
    pool = await db.create_pool(settings.database_url, max_size=20)
    # The work on messages runs in child processes with a hard time limit, never on this
    # event loop (docs/architecture.md §7): started before the first task, closed after the
    # last step in flight has finished.
    work = work_pool(settings, settings.work_processes)
    await work.start()
    crm = build_crm(settings)  # INBOXCRM_CRM_PROVIDER / INBOXCRM_MAIL_PROVIDER
    mail = build_mail(settings)
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[InboundEmailWorkflow, DriftCheckWorkflow],
        activities=[*activity_functions(pool, crm, mail, build_extractor(settings),
                                        settings.max_retry_after_seconds,
                                        settings.public_relay_base_url, work),
                    DriftActivities(pool, crm, mail).check_destination_drift],
        max_concurrent_activities=settings.max_concurrent_activities,
        max_concurrent_workflow_tasks=settings.max_concurrent_workflow_tasks,
        # Items parked for review wait for days: keep a bounded number in memory; an evicted
        # one replays its (short) history when its signal arrives.
        max_cached_workflows=settings.max_cached_workflows,
        # A PostgreSQL outage is reported as `StoreUnavailable` by every activity.
        interceptors=[StoreOutageInterceptor()],
        # A rollout drains (docs/architecture.md §4): the steps in flight (local activities,
        # an SMTP send among them) always run to their end; no new step or destination call
        # starts (`activities/outbox.py`, `activities/step_attempts.py`). This grace is what
        # regular activities get before they are cancelled: the drift check, and the steps
        # of workflows started before `local-steps`.
        graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace_seconds),
    )
    try:
        async with worker:
            log.info("worker running on task queue %s", settings.task_queue)
            await stop.wait()
    finally:
        await crm.aclose()
        await mail.aclose()
        await work.close()
        await pool.close()


def main() -> None:
    configure_logging("worker")
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
