"""DriftCheckWorkflow: one scheduled reconciliation run (docs/architecture.md §4).

Started by the Temporal Schedule `schemas.contract.drift_check_schedule_id(task_queue)`
(registered by `deploy/bootstrap.py` and by the local stack). The window ends at the run's
own start time (`workflow.now()`, deterministic on replay); the activity samples, asks the
destinations and stores the report. A run that succeeded says what it sampled; it is not a
proof that every message reached the CRM.

No `from __future__ import annotations`: the sandbox evaluates this file for every run.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from inboxcrm.activities.drift import DriftActivities
    from inboxcrm.schemas.contract import DRIFT_CHECK_WORKFLOW_TYPE
    from inboxcrm.schemas.drift import DriftCheckInput, DriftCheckRequest, DriftSummary, Trigger

# A sample of a few hundred lookups at a few at a time, each bounded by the HTTP timeout.
DRIFT_CHECK_TIMEOUT = timedelta(minutes=10)
# The report row is keyed by the run, so a retry rewrites it; a destination that stays down
# shows up as "unchecked" findings, not as retries.
DRIFT_CHECK_RETRY = RetryPolicy(initial_interval=timedelta(seconds=5),
                                maximum_interval=timedelta(minutes=1), maximum_attempts=3)


@workflow.defn(name=DRIFT_CHECK_WORKFLOW_TYPE)
class DriftCheckWorkflow:
    @workflow.run
    async def run(self, params: DriftCheckInput) -> DriftSummary:
        end = workflow.now()
        request = DriftCheckRequest(
            window_start=(end - timedelta(seconds=params.window_seconds)).isoformat(),
            window_end=end.isoformat(), sample_size=params.sample_size,
            trigger=Trigger.SCHEDULE.value)
        return await workflow.execute_activity_method(
            DriftActivities.check_destination_drift, request,
            start_to_close_timeout=DRIFT_CHECK_TIMEOUT, retry_policy=DRIFT_CHECK_RETRY)
