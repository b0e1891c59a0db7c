"""The engine floor: a bare workflow with the same number of steps as a happy-path
InboundEmailWorkflow, and activities that do nothing.

InboundEmailWorkflow's happy path runs four regular activities (extract_message,
match_and_plan, upsert_contact_in_crm, submit_followup_email) and one local activity
(record_item_state, when it enters `completed`). The floor mirrors exactly that: four
no-op regular activities and `local_activities` (default 1) no-op local activities, with
the same timeouts' order of magnitude and bounded retries. `activities` changes the count
when the product's happy path gains or loses a step (`--floor-activities`). No search attributes, no
payload codec, no database, no HTTP: what is left is Temporal's own cost per item.

Kept free of heavy imports: the workflow sandbox re-imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

WORKFLOW_NAME = "BenchFloorWorkflow"
STEPS = ("floor_extract", "floor_plan", "floor_crm", "floor_send")
RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=5)


@dataclass
class FloorInput:
    item: str
    local_activities: int = 1
    activities: int = 4


@activity.defn(name="floor_extract")
async def floor_extract(item: str) -> str:
    return item


@activity.defn(name="floor_plan")
async def floor_plan(item: str) -> str:
    return item


@activity.defn(name="floor_crm")
async def floor_crm(item: str) -> str:
    return item


@activity.defn(name="floor_send")
async def floor_send(item: str) -> str:
    return item


@activity.defn(name="floor_record")
async def floor_record(item: str) -> None:
    return None


ACTIVITIES = [floor_extract, floor_plan, floor_crm, floor_send, floor_record]


@workflow.defn(name=WORKFLOW_NAME)
class FloorWorkflow:
    @workflow.run
    async def run(self, params: FloorInput) -> str:
        for i in range(params.activities):
            await workflow.execute_activity(
                STEPS[i % len(STEPS)], params.item, start_to_close_timeout=timedelta(seconds=25),
                retry_policy=RETRY)
        for _ in range(params.local_activities):
            await workflow.execute_local_activity(
                floor_record, params.item, start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RETRY)
        return "completed"
