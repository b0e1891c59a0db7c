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
# Sent by `inboxcrm resume` to items parked on a pause: check again now (no body). A wake
# that arrives when nothing is parked changes nothing.
SIGNAL_WAKE = "wake"

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
