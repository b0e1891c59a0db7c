"""The sweeper's second duty: a run that ended without settling its item (it failed, was
terminated, timed out or was cancelled) leaves the item where it was, in a state that says it
is moving while nothing moves it. The relay finds such runs in Temporal's visibility store and
writes the item `failed`, with the reason and an open review task, so it shows in
`inboxcrm queue` and `GET /review/`; `inboxcrm replay` runs it again
(docs/architecture.md §3).

Each pass lists the runs of this task queue that closed that way since the previous pass
(less an overlap for visibility's lag; the first pass looks back
INBOXCRM_FAILED_RUN_LOOKBACK_HOURS), keeps the items the store still shows unsettled, and
checks that the closed run is still the latest under its workflow ID (a replay may be
running). The write is one idempotent statement; any number of relays may run it."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import asyncpg
from temporalio.client import WorkflowExecution, WorkflowExecutionStatus
from temporalio.service import RPCError

from inboxcrm.domain.policy import get_policy
from inboxcrm.ingress.intake import TemporalHandle
from inboxcrm.schemas.contract import WORKFLOW_TYPE
from inboxcrm.schemas.models import TERMINAL_STATES
from inboxcrm.store import failed_runs

log = logging.getLogger("inboxcrm.ingress.failed_runs")

# How a closed run that settled nothing is named in the item's reason.
REASONS = dict(zip((WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TERMINATED,
                    WorkflowExecutionStatus.TIMED_OUT, WorkflowExecutionStatus.CANCELED),
                   failed_runs.REASONS, strict=True))
# Visibility shows a closed run a little after it closed: each pass looks back this far
# before the previous one.
OVERLAP = timedelta(minutes=5)
SETTLED = sorted(state.value for state in TERMINAL_STATES)


def closed_runs_query(task_queue: str, since: datetime) -> str:
    """Runs of this queue that closed without completing, since `since`."""
    return (f"WorkflowType = '{WORKFLOW_TYPE}' AND TaskQueue = '{task_queue}' "
            "AND ExecutionStatus IN ('Failed', 'Terminated', 'TimedOut', 'Canceled') "
            f"AND CloseTime > '{since.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}'")


class FailedRuns:
    def __init__(self, pool: asyncpg.Pool, temporal: TemporalHandle, task_queue: str,
                 lookback: timedelta) -> None:
        self._pool = pool
        self._temporal = temporal
        self._task_queue = task_queue
        self._lookback = lookback
        self._since: datetime | None = None

    async def check(self) -> int:
        """One pass; returns how many items were written `failed`."""
        started = datetime.now(UTC)
        since = self._since or started - self._lookback
        closed: dict[str, WorkflowExecution] = {}
        # Every namespace the tenants use (docs/architecture.md §7, Namespaces); a workflow
        # ID names its tenant, so it is one item whichever namespace it was found in.
        for client in await self._temporal.every_namespace():
            async for execution in client.list_workflows(closed_runs_query(self._task_queue,
                                                                           since)):
                known = closed.get(execution.id)
                if (known is None
                        or (execution.close_time or since) > (known.close_time or since)):
                    closed[execution.id] = execution
        marked = 0
        if closed:
            async with self._pool.acquire() as conn:
                rows = await failed_runs.unsettled(conn, closed, SETTLED)
            for row in rows:
                if await self._mark(closed[row["workflow_id"]], row["tenant"]):
                    marked += 1
        self._since = started - OVERLAP
        return marked

    async def _mark(self, run: WorkflowExecution, tenant: str) -> bool:
        client = await self._temporal.get(tenant)
        try:
            latest = await client.get_workflow_handle(run.id).describe()
        except RPCError:
            return False  # the history is gone or unreachable: the next pass tries again
        if latest.run_id != run.run_id or latest.status not in REASONS:
            return False  # a newer run (a replay, a continuation) owns the item
        reason = REASONS[latest.status]
        policy = get_policy(tenant)
        owner = policy.owner_for(reason, "integration")  # a run that ended unsettled
        async with self._pool.acquire() as conn:
            done = await failed_runs.mark_failed(
                conn, run.id, reason=reason, settled=SETTLED,
                closed_at=latest.close_time or datetime.now(UTC), owner=owner,
                escalation_seconds=policy.escalation_hours * 3600,
                detail={"state": "failed", "reason": reason, "run_id": run.run_id,
                        "review_reason": reason, "owner": owner})
        if done:
            log.warning("run %s ended %s without settling its item: marked failed",
                        run.run_id, latest.status.name if latest.status else "unknown")
        return done


async def check_forever(checker: FailedRuns, interval_seconds: float) -> None:
    while True:
        await asyncio.sleep(interval_seconds)
        try:
            marked = await checker.check()
            if marked:
                log.info("marked %d item(s) of ended runs failed", marked)
        except Exception:  # noqa: BLE001 - the sweeper must outlive any single failure
            log.exception("failed-run pass failed")
