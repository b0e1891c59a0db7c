"""ReviewNoticesWorkflow: one scheduled run of the review notices (docs/architecture.md §6,
"Going live"). Started by the Temporal Schedule
`schemas.contract.review_notices_schedule_id(task_queue)` (registered by `deploy/bootstrap.py`
and by the local stack); its one activity batches and posts, tenant by tenant.

No `from __future__ import annotations`: the sandbox evaluates this file for every run.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from inboxcrm.activities.notify import NoticeActivities
    from inboxcrm.schemas.contract import REVIEW_NOTICES_WORKFLOW_TYPE
    from inboxcrm.schemas.notices import ReviewNoticesInput, ReviewNoticesSummary

# A few tenants, a few batches each, each post bounded by the HTTP timeout.
REVIEW_NOTICES_TIMEOUT = timedelta(minutes=5)
# An unreachable store is retried briefly; an unreachable webhook is not an activity failure
# (the next scheduled run is its retry).
REVIEW_NOTICES_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2),
                                   maximum_interval=timedelta(seconds=20), maximum_attempts=3)


@workflow.defn(name=REVIEW_NOTICES_WORKFLOW_TYPE)
class ReviewNoticesWorkflow:
    @workflow.run
    async def run(self, params: ReviewNoticesInput) -> ReviewNoticesSummary:
        return await workflow.execute_activity_method(
            NoticeActivities.send_review_notices, params,
            start_to_close_timeout=REVIEW_NOTICES_TIMEOUT, retry_policy=REVIEW_NOTICES_RETRY,
            heartbeat_timeout=timedelta(seconds=60))
