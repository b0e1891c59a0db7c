"""ConsentSyncWorkflow: one scheduled run of the CRM opt-out write-backs (docs/consent.md).
Started by the Temporal Schedule `schemas.contract.consent_sync_schedule_id(task_queue)`
(registered by `deploy/bootstrap.py` and by the local stack); its one activity claims the due
`crm_consent_writes` rows and writes each to its tenant's CRM.

The durable part is the row, not the run: it was written with the suppression, and a write
that fails waits for its own backoff and is claimed again by a later run; a run that dies
leaves its claims to expire. No `from __future__ import annotations`: the sandbox evaluates
this file for every run.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from inboxcrm.activities.consent import ConsentActivities
    from inboxcrm.schemas.consent import ConsentSyncInput, ConsentSyncSummary
    from inboxcrm.schemas.contract import CONSENT_SYNC_WORKFLOW_TYPE

# A batch of CRM calls, each bounded by the HTTP timeout; heartbeats per row.
CONSENT_SYNC_TIMEOUT = timedelta(minutes=5)
# An unreachable store is retried briefly; a failing CRM is not an activity failure (the row's
# backoff and the next scheduled run are its retry).
CONSENT_SYNC_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2),
                                 maximum_interval=timedelta(seconds=20), maximum_attempts=3)


@workflow.defn(name=CONSENT_SYNC_WORKFLOW_TYPE)
class ConsentSyncWorkflow:
    @workflow.run
    async def run(self, params: ConsentSyncInput) -> ConsentSyncSummary:
        return await workflow.execute_activity_method(
            ConsentActivities.sync_consent_writes, params,
            start_to_close_timeout=CONSENT_SYNC_TIMEOUT, retry_policy=CONSENT_SYNC_RETRY,
            heartbeat_timeout=timedelta(seconds=60))
