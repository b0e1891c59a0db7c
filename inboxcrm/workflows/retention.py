"""RetentionWorkflow: one scheduled retention run (docs/architecture.md §7, "Retention").
Started by the Temporal Schedule `schemas.contract.retention_schedule_id(task_queue)`
(registered by `deploy/bootstrap.py` and by the local stack); its one activity applies each
tenant's policy `retention` periods in bounded batches.

No `from __future__ import annotations`: the sandbox evaluates this file for every run.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from inboxcrm.activities.retention import RetentionActivities
    from inboxcrm.schemas.contract import RETENTION_WORKFLOW_TYPE
    from inboxcrm.schemas.retention import RetentionInput, RetentionSummary

# Bounded batches per tenant; a run that is cut short is carried on by the next one.
RETENTION_TIMEOUT = timedelta(minutes=30)
# Each batch commits on its own, so a retry only redoes what is still due.
RETENTION_RETRY = RetryPolicy(initial_interval=timedelta(seconds=5),
                              maximum_interval=timedelta(minutes=1), maximum_attempts=3)


@workflow.defn(name=RETENTION_WORKFLOW_TYPE)
class RetentionWorkflow:
    @workflow.run
    async def run(self, params: RetentionInput) -> RetentionSummary:
        return await workflow.execute_activity_method(
            RetentionActivities.apply_retention, params,
            start_to_close_timeout=RETENTION_TIMEOUT, retry_policy=RETENTION_RETRY,
            heartbeat_timeout=timedelta(seconds=60))
