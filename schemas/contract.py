"""The names the workflow shares with everyone who talks to it: the relay starts it, the CLI
sends decisions and reads its status, the stack registers its search attributes, the Web UI
filters on them. One definition here; nothing else spells these as strings
(`docs/architecture.md`, "People in the loop").
"""

from __future__ import annotations

from enum import StrEnum

from temporalio.common import SearchAttributeKey

WORKFLOW_TYPE = "InboundEmailWorkflow"
DEFAULT_TASK_QUEUE = "inboxcrm"


class Decision(StrEnum):
    """A reviewer's decision: each is a signal (the UI's "Send a Signal") of this name."""

    APPROVE = "approve"
    HOLD = "hold"
    REJECT = "reject"
    RETRY = "retry"
    RESOLVE = "resolve"


QUERY_STATUS = "status"

# Search attributes: the Temporal UI's list filtered on `NeedsReview = true` is the review
# queue. Registration (`make up`, bootstrap) is derived from this tuple.
SA_STATE = SearchAttributeKey.for_keyword("InboxState")
SA_REVIEW_REASON = SearchAttributeKey.for_keyword("ReviewReason")
SA_REVIEW_OWNER = SearchAttributeKey.for_keyword("ReviewOwner")
SA_TENANT = SearchAttributeKey.for_keyword("Tenant")
SA_NEEDS_REVIEW = SearchAttributeKey.for_bool("NeedsReview")
SA_OVERDUE = SearchAttributeKey.for_bool("ReviewOverdue")
SEARCH_ATTRIBUTES: tuple[SearchAttributeKey[str] | SearchAttributeKey[bool], ...] = (
    SA_STATE, SA_REVIEW_REASON, SA_REVIEW_OWNER, SA_TENANT, SA_NEEDS_REVIEW, SA_OVERDUE,
)

# The scheduled drift check (docs/architecture.md §4, "destination truth"): a Temporal Schedule
# starts this workflow on the worker's task queue (`INBOXCRM_TASK_QUEUE`, default
# DEFAULT_TASK_QUEUE), so each deployment's schedule reaches its own workers.
DRIFT_CHECK_WORKFLOW_TYPE = "DriftCheckWorkflow"
DRIFT_CHECK_SCHEDULE_ID = "inboxcrm-drift-check"
DRIFT_CHECK_ACTIVITY = "check_destination_drift"


def drift_check_schedule_id(task_queue: str) -> str:
    """One schedule per task queue: deployments (and test stacks) sharing a Temporal
    namespace never start each other's checks."""
    if task_queue == DEFAULT_TASK_QUEUE:
        return DRIFT_CHECK_SCHEDULE_ID
    return f"{DRIFT_CHECK_SCHEDULE_ID}/{task_queue}"
