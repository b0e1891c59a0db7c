"""The names the workflow shares with everyone who talks to it: the relay starts it, the CLI
sends decisions and reads its status, the stack registers its search attributes, the Web UI
filters on them. One definition here; nothing else spells these as strings
(`docs/architecture.md`, "People in the loop").
"""

from __future__ import annotations

from enum import StrEnum

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from inboxcrm.schemas.models import ItemState

WORKFLOW_TYPE = "InboundEmailWorkflow"
DEFAULT_TASK_QUEUE = "inboxcrm"


class Decision(StrEnum):
    """A reviewer's decision. Each is an update of this name (the UI's "Send an Update", the
    CLI: validated at once, answered with the new state or refused with the reason) and a
    signal of this name (the UI's "Send a Signal", older callers: bound to the wait open when
    it arrives, recorded as stale and dropped otherwise)."""

    APPROVE = "approve"
    HOLD = "hold"
    REJECT = "reject"
    RETRY = "retry"
    RESOLVE = "resolve"
    # A deliberate second send of a follow-up whose send is unconfirmed: a new intent with
    # its own key and approval (docs/architecture.md §6, "Authority").
    SEND_AGAIN = "send_again"


# The ApplicationError type of a decision the workflow refused after accepting the update
# (its wait was answered meanwhile). Its message is a reason for a person, never data.
DECISION_REFUSED = "DecisionRefused"

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


def start_search_attributes(tenant: str) -> TypedSearchAttributes:
    """The search attributes an item's workflow is started with: its tenant and its first
    state. A run of this release started with them does not upsert them itself (one history
    event and one visibility write fewer per item); a run started without them, by an older
    relay, or run by an earlier build, still does (docs/architecture.md §3)."""
    return TypedSearchAttributes([SearchAttributePair(SA_TENANT, tenant),
                                  SearchAttributePair(SA_STATE, ItemState.EXTRACTING.value)])


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


# Review notices (docs/architecture.md §6, "Going live"): a Temporal Schedule per task queue
# starts this workflow, whose one activity tells each tenant's reviewers, in one message per
# tenant, about the review tasks that opened or became overdue since the last run.
REVIEW_NOTICES_WORKFLOW_TYPE = "ReviewNoticesWorkflow"
REVIEW_NOTICES_SCHEDULE_ID = "inboxcrm-review-notices"
REVIEW_NOTICES_ACTIVITY = "send_review_notices"


def review_notices_schedule_id(task_queue: str) -> str:
    """One schedule per task queue, as the drift check's."""
    if task_queue == DEFAULT_TASK_QUEUE:
        return REVIEW_NOTICES_SCHEDULE_ID
    return f"{REVIEW_NOTICES_SCHEDULE_ID}/{task_queue}"


CONSENT_SYNC_WORKFLOW_TYPE = "ConsentSyncWorkflow"
CONSENT_SYNC_SCHEDULE_ID = "inboxcrm-consent-sync"
CONSENT_SYNC_ACTIVITY = "sync_consent_writes"


def consent_sync_schedule_id(task_queue: str) -> str:
    """One schedule per task queue, as the drift check's."""
    if task_queue == DEFAULT_TASK_QUEUE:
        return CONSENT_SYNC_SCHEDULE_ID
    return f"{CONSENT_SYNC_SCHEDULE_ID}/{task_queue}"


# Retention (docs/architecture.md §7): a Temporal Schedule per task queue starts this
# workflow, whose one activity applies each tenant's policy `retention` periods.
RETENTION_WORKFLOW_TYPE = "RetentionWorkflow"
RETENTION_SCHEDULE_ID = "inboxcrm-retention"
RETENTION_ACTIVITY = "apply_retention"


def retention_schedule_id(task_queue: str) -> str:
    """One schedule per task queue, as the drift check's."""
    if task_queue == DEFAULT_TASK_QUEUE:
        return RETENTION_SCHEDULE_ID
    return f"{RETENTION_SCHEDULE_ID}/{task_queue}"


def authority_refusal(role: str, action: str = "retry") -> str:
    """What a person reads (desk, CLI, UI) when a retry (or a send-again) of an ambiguous
    send needs a role they lack; or an approval of a follow-up held for approval."""
    if action == "approve":
        return (f"refused (authority_required): the tenant's policy lets only a reviewer "
                f"with the role {role!r} approve this follow-up (authority.approve_followup), "
                "through the review desk or `inboxcrm review` with their own token")
    doing = "sending this follow-up again" if action == "send_again" else (
        "retrying this ambiguous send")
    return (f"refused (authority_required): {doing} may email the "
            f"customer a second time; the tenant's policy lets only a reviewer with the role "
            f"{role!r} do it, through the review desk or `inboxcrm review` with their own "
            "token (check the destination first, see the review card; `resolve` with the "
            "provider's message ID if it was sent)")


def send_again_refusal(code: str) -> str:
    """What a person reads when a send-again cannot be made: the code names why."""
    why = {
        "no_followup_to_repeat": "this wait has no follow-up whose send is unconfirmed or "
                                 "was sent; send-again repeats only such a follow-up (a "
                                 "blocked send that sent nothing: retry)",
        "followup_not_sent": "the follow-up was not sent (its intent is neither sending nor "
                             "sent): retry it with its own key instead",
        "suppressed": "the person is suppressed now: nothing more may be sent to them",
        "contact_inactive": "the contact is no longer active: nothing more may be sent",
        "quiet_period": "another follow-up reached this contact within the rule's quiet "
                        "period",
        "reason_required": "say why the customer should get it again (--reason, the note)",
    }.get(code, code)
    return f"refused ({code}): send-again: {why}"


def decision_body(action: str, wait_id: str, needs_sender: bool = False) -> dict[str, object]:
    """The exact body a decision needs at a wait (placeholders in angle brackets): shown in
    the UI's current details and on the review card, sent by the CLI."""
    body: dict[str, object] = {"reviewer": "<your name>", "wait_id": wait_id, "note": "<why>"}
    if action == Decision.RESOLVE:
        body["evidence"] = "<CRM record ID or provider message ID>"
    if action == Decision.SEND_AGAIN:
        body["note"] = "<why the customer should get it again (required)>"
    if action == Decision.APPROVE and needs_sender:
        body["corrections"] = {"sender_email": "<the sender's address>"}
    return body
