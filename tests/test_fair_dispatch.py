"""Task-queue fairness on the stack's Temporal server (issue 38, docs/capacity.md "Fair
across tenants"): one tenant's backlog waits behind its own tasks only. Tenant acme's
BACKLOG workflows are queued first, then one of globex's, each started with the priority
the relay gives an item (`tenant_priority`); only then does a worker poll, with two workflow
task slots. Without fairness the queue is first come, first served and globex's task is
handed out among the last; with it, among the first few. The order is read from the
server's own record (each run's WorkflowTaskStarted), not from a clock of the test's."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from inboxcrm.domain.policy import tenant_priority
from inboxcrm.stack.stack import Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")

BACKLOG = 40
# globex's place among the BACKLOG + 1 dispatched tasks: first come, first served puts it
# near the end (the queue's partitions each keep their own order, so not exactly last);
# fairness puts it in the first round of its partition.
WITHIN = 8


@workflow.defn(sandboxed=False)
class FairProbeWorkflow:
    @workflow.run
    async def run(self) -> str:
        return workflow.info().workflow_id


async def first_task_started(client: Client, workflow_id: str) -> tuple[int, int]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            return event.event_time.seconds, event.event_time.nanos
    raise AssertionError(f"{workflow_id}: no workflow task started")


async def late_task_place(client: Client, late_tenant: str, **worker_options: Any) -> int:
    """Where a task started after acme's BACKLOG is handed out, started for `late_tenant`,
    by a worker of 2 slots (or of `worker_options`' slots)."""
    queue = f"inboxcrm-fair-{uuid.uuid4().hex[:6]}"
    ids = [f"fair-acme-{queue}-{i:03d}" for i in range(BACKLOG)]
    for workflow_id in ids:
        await client.start_workflow(FairProbeWorkflow.run, id=workflow_id, task_queue=queue,
                                    priority=tenant_priority("acme"))
    late = f"fair-late-{late_tenant}-{queue}"
    await client.start_workflow(FairProbeWorkflow.run, id=late, task_queue=queue,
                                priority=tenant_priority(late_tenant))
    ids.append(late)
    options = worker_options or {"max_concurrent_workflow_tasks": 2}
    async with Worker(client, task_queue=queue, workflows=[FairProbeWorkflow],
                      max_cached_workflows=0, **options):
        results = await asyncio.gather(*(client.get_workflow_handle(w).result() for w in ids))
    assert results == ids
    started = {w: await first_task_started(client, w) for w in ids}
    return sorted(ids, key=lambda w: started[w]).index(late) + 1


async def test_a_tenants_backlog_does_not_hold_another_tenants_task(stack: Stack) -> None:
    client = await Client.connect(stack.temporal_address)
    # The control: one more of acme's own waits behind acme's backlog (what every tenant's
    # task did before fairness), so the bound below is one first come, first served misses.
    same = await late_task_place(client, "acme")
    assert same > WITHIN, f"acme's late task dispatched {same}th of {BACKLOG + 1}"
    other = await late_task_place(client, "globex")
    assert other <= WITHIN, f"globex's task dispatched {other}th of {BACKLOG + 1}"


async def test_item_slots_that_follow_the_cpu_serve_a_backlog_in_fair_order(
        stack: Stack) -> None:
    """INBOXCRM_WORKFLOW_TASK_TARGET_CPU: the worker's workflow slots come from Temporal's
    resource-based supplier (inboxcrm/worker.py `slot_options`); the SDK accepts the tuner,
    the backlog is served, and globex's late task is still handed out among the first."""
    from inboxcrm.platform.config import Settings
    from inboxcrm.worker import slot_options

    options = slot_options(Settings(env="local", workflow_task_target_cpu=0.8,
                                    min_concurrent_workflow_tasks=1,
                                    max_concurrent_workflow_tasks=2))
    assert set(options) == {"tuner"}
    client = await Client.connect(stack.temporal_address)
    place = await late_task_place(client, "globex", **options)
    assert place <= WITHIN, f"globex's task dispatched {place}th of {BACKLOG + 1}"
