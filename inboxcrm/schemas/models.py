"""Workflow and activity inputs/outputs: small dataclasses, one per call, so fields can be
added without breaking running workflows. None of them carries message bodies or personal
data: activities read those from PostgreSQL by event ID.

No `from __future__ import annotations` here: the SDK's converter calls get_type_hints()
on these classes for every payload it decodes, and string annotations would be compiled
and evaluated again each time."""

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, get_args

# The states the workflow branches on, as Literal types mypy checks (plain strings on the
# wire: the payloads in stored histories stay byte-identical).
Route = Literal["auto", "review", "ignore", "opt_out"]
PlanOutcome = Literal["planned", "review", "suppressed", "opted_out"]
# `review`: the operation wrote nothing and needs a person's decision first (a CRM upsert
# that met several existing records with the contact's email).
OperationOutcome = Literal["completed", "parked", "cancelled", "review"]
DecisionAction = Literal["approve", "hold", "reject", "retry", "resolve", "send_again"]

ROUTES: tuple[Route, ...] = get_args(Route)
DECISION_ACTIONS: tuple[DecisionAction, ...] = get_args(DecisionAction)


class ItemState(StrEnum):
    """Per-item states (docs/architecture.md §3)."""

    RECEIVED = "received"
    EXTRACTING = "extracting"
    AWAITING_REVIEW = "awaiting_review"
    MATCHING = "matching"
    CRM_PENDING = "crm_pending"
    SEND_PENDING = "send_pending"
    COMPLETED = "completed"
    IGNORED = "ignored"
    SUPPRESSED = "suppressed"
    REJECTED = "rejected"
    BLOCKED = "blocked"
    AMBIGUOUS = "ambiguous"
    HELD = "held"
    FAILED = "failed"
    # A tenant in shadow mode: planned, nothing written or sent (docs/architecture.md §6).
    SHADOWED = "shadowed"


TERMINAL_STATES = frozenset(
    {ItemState.COMPLETED, ItemState.IGNORED, ItemState.SUPPRESSED, ItemState.REJECTED,
     ItemState.FAILED, ItemState.SHADOWED}
)
# States in which the item waits for a person (it is in the owned review queue).
REVIEW_STATES = frozenset(
    {ItemState.AWAITING_REVIEW, ItemState.BLOCKED, ItemState.AMBIGUOUS, ItemState.HELD}
)


class Action(StrEnum):
    CRM_UPSERT = "crm-upsert"
    CRM_NOTE = "crm-note"
    SEND = "send"
    # The conversation in the CRM (docs/architecture.md §5, "The conversation in the CRM"):
    # the inbound email as the CRM's email activity, and the follow-up once sent.
    CRM_EMAIL = "crm-email"
    CRM_SENT = "crm-sent"


def operation_key(workflow_id: str, action: str) -> str:
    """`{workflow_id}:{action}`: built from the workflow ID, never the run ID, so a replay
    or reset of the same item reuses every key."""
    return f"{workflow_id}:{action}"


# A deliberate second send (`send_again`, docs/architecture.md §6 "Authority"): generation n
# of an item's follow-up has its own operations, `{workflow_id}:again-{n}:send` and
# `…:again-{n}:crm-sent`, so the action stays the last part (budgets, the status query) and
# no key of the first send is reused.
AGAIN_PREFIX = "again-"


def again_op_key(workflow_id: str, generation: int, action: str) -> str:
    """The operation key of `action` for the follow-up's generation (1: the planned one)."""
    if generation <= 1:
        return operation_key(workflow_id, action)
    return f"{workflow_id}:{AGAIN_PREFIX}{generation}:{action}"


def is_again_key(op_key: str) -> bool:
    """An operation of a deliberate second (or later) send."""
    parts = op_key.rsplit(":", 2)
    return len(parts) == 3 and parts[1].startswith(AGAIN_PREFIX) and parts[1][
        len(AGAIN_PREFIX):].isdigit()


def inbound_workflow_id(tenant: str, source: str, mailbox: str, delivery_id: str) -> str:
    return f"inbound/{tenant}/{source}/{mailbox}/{delivery_id}"


@dataclass
class ItemRef:
    """Identifies the item an activity works on."""

    event_id: str
    workflow_id: str
    tenant: str


@dataclass
class ExtractResult:
    route: Route
    reasons: list[str] = field(default_factory=list)
    extractor: str = "rules"
    # From the tenant's policy, so the workflow needs no I/O to know who owns its reviews.
    review_owner: str = "sales-ops"
    # The policy's owners per cause and the role that alone may repeat a customer-facing
    # action (docs/architecture.md §6). A result recorded before issue 37 has neither: its
    # item's waits all go to `review_owner` and any reviewer may retry, as it ran.
    owners: dict[str, str] = field(default_factory=dict)
    repeat_role: str | None = None
    # The role that alone may approve a follow-up held for approval (policy
    # `authority.approve_followup`, docs/architecture.md §6, "Edited drafts").
    approve_role: str | None = None
    escalation_hours: float = 24.0
    # False: the message gives no usable sender address, so an approval must carry
    # `corrections.sender_email` (the planner has nobody to match otherwise).
    identity_known: bool = True
    # Where the review card lives (the relay's public URL), for the UI's current details.
    review_base_url: str = ""
    # The tenant was in shadow mode when this item was first extracted: it is planned and
    # shadowed, never carried out (docs/architecture.md §6, "Going live").
    shadow: bool = False
    # Not extracted yet: the model call runs as a regular activity (`extract_with_model`) on
    # this task queue (docs/architecture.md §5). Empty: this result is the extraction.
    model_queue: str = ""


@dataclass
class PlanInput:
    item: ItemRef
    approved_by: str | None = None  # a reviewer approved the item (review reasons cleared)


@dataclass
class StepRetry:
    """A tenant's retry settings of one kind of destination call (policy `retries`), carried
    in the plan so that the workflow's retry policy and the ledger's attempt budget agree and
    a policy edit never changes a plan already made (docs/architecture.md §4, "Retries")."""

    max_attempts: int
    initial_seconds: float
    maximum_seconds: float
    backoff: float = 2.0


# The bounds a tenant's retry settings stay within (policy `retries`): enough attempts to ride
# out a provider's rate limit or a short outage, never so many or so fast that one tenant
# hammers a shared provider account, and never a wait so long that an item sits unseen (past
# the last attempt a person is asked). The ledger enforces the same budget.
RETRY_MAX_ATTEMPTS = 10
RETRY_INITIAL_SECONDS = (0.5, 60.0)
RETRY_MAXIMUM_SECONDS = 600.0
RETRY_BACKOFF = (1.0, 4.0)
# The defaults: what every tenant had before policy `retries`.
DEFAULT_CRM_RETRY = StepRetry(max_attempts=6, initial_seconds=1.0, maximum_seconds=60.0)
DEFAULT_SEND_RETRY = StepRetry(max_attempts=6, initial_seconds=1.0, maximum_seconds=60.0)
# A rule of `urgency = "urgent"`: quick attempts, so its follow-up goes out or reaches a
# person within about a minute.
DEFAULT_URGENT_SEND_RETRY = StepRetry(max_attempts=4, initial_seconds=0.5,
                                      maximum_seconds=10.0)


@dataclass
class PlanResult:
    outcome: PlanOutcome
    reason: str | None = None
    contact_id: str | None = None
    crm_op_key: str | None = None
    note_op_key: str | None = None
    send_op_key: str | None = None
    intent_id: str | None = None
    intent_needs_approval: bool = False
    candidates: int = 0
    # Why the follow-up waits for approval when the policy alone would not ask: `ramp_limit`
    # (a first live run's hourly cap of automatic follow-ups is used up). None: the policy.
    approval_reason: str | None = None
    # The conversation in the CRM: the inbound email's activity (`crm-email`) and the sent
    # follow-up's (`crm-sent`). None in a plan made before them: the workflow skips them.
    email_op_key: str | None = None
    sent_op_key: str | None = None
    # The tenant's retry settings of the CRM calls and of the send (policy `retries`, the
    # rule's `send_retry`). None in a plan made before them: the code's defaults.
    crm_retry: StepRetry | None = None
    send_retry: StepRetry | None = None


@dataclass
class ShadowPlanResult:
    """What a shadowed item would have done, in one word (`would_complete`, `would_review`,
    `would_ignore`, `would_suppress`); the whole plan is stored on the event."""

    outcome: str


@dataclass
class OperationStatus:
    """One side effect as the workflow last saw it (the ledger row is the truth)."""

    op_key: str
    status: str = "pending"
    destination_id: str | None = None


@dataclass
class WorkflowState:
    """An item's workflow state that outlives a run: all of it is handed whole to the
    continuation (continue-as-new), so no field is copied by hand and none is forgotten.
    What stays per run (the open wait, queued decisions, what the search attributes show,
    the store-wait backoff) is rebuilt by each run; everything else is in the store (the
    ledger tells which operations are done).

    Every field has a default: a continuation started with the earlier `CarriedState` (the
    fields up to `card_url`, under the same names) decodes into this class, the rest as
    defaults."""

    # The plan being carried out (None until the item is planned; a continuation has one).
    plan: PlanResult | None = None
    owner: str = "sales-ops"
    escalation_hours: float = 24.0
    operations: dict[str, OperationStatus] = field(default_factory=dict)
    # The people-in-the-loop state a later wait depends on: who approved the item, whether
    # they declined its follow-up, how many waits were opened (wait IDs stay unique per
    # item across runs) and the review card's link.
    approved_by: str | None = None
    send_followup: bool = True
    wait_seq: int = 0
    card_url: str = ""
    # Whether the sender's identity is known (an approval must name it otherwise).
    identity_known: bool = True
    # The ledger attempt the next call of each operation makes, and its budget: the
    # `summary` the UI shows on the step ("crm-upsert attempt 7/12").
    next_attempt: dict[str, tuple[int, int]] = field(default_factory=dict)
    # The policy's owners per cause and the role that may repeat a customer-facing action
    # (from the extraction, see ExtractResult), for every later wait of the item.
    owners: dict[str, str] = field(default_factory=dict)
    repeat_role: str | None = None
    # The follow-up's generation: 1 as planned, n after n-1 deliberate sends again
    # (`send_again`); the keys of its operations derive from it (`again_op_key`).
    send_generation: int = 1
    # The role that alone may approve a follow-up held for approval (`ExtractResult`).
    approve_role: str | None = None


@dataclass
class InboundEmailInput:
    event_id: str
    tenant: str
    # Set only by continue-as-new: the workflow state, and the continuation resumes after
    # planning. (The name stays: continuations started with it are open.)
    carried: WorkflowState | None = None


@dataclass
class ItemEnd:
    """The state the workflow has decided an item ends in once an operation completes (its
    last step): the operation's success statement records it too, as `record_item_state`
    would (docs/architecture.md §3)."""

    state: str
    reason: str | None = None


@dataclass
class OperationInput:
    item: ItemRef
    op_key: str
    # The item's end, when this is its last step (None: the workflow records what follows).
    ends_item: ItemEnd | None = None


@dataclass
class OperationResult:
    status: OperationOutcome
    destination_id: str | None = None
    reason: str | None = None
    reconciled: bool = False
    # Parked by a destination's limit (not an operator's pause): when it ends (ISO 8601), so
    # the workflow checks again then, not only on its backing-off fallback.
    retry_at: str | None = None
    # This attempt's success also recorded the item's end it was given
    # (`OperationInput.ends_item`): the workflow does not record it again. False for a
    # result found already completed (a retry after a crash, a person's `resolve`).
    end_recorded: bool = False


@dataclass
class StateChange:
    item: ItemRef
    state: str
    reason: str | None = None
    # Opening a review task (when the state waits for a person):
    review_reason: str | None = None
    review_owner: str | None = None
    destination_ref: str | None = None
    escalation_hours: float | None = None
    # The wait the review task answers (fixed when it opens), for the review card.
    wait_id: str | None = None
    allowed: list[str] | None = None
    escalate_at: str | None = None          # ISO 8601, fixed when the wait opens
    needs_sender: bool = False


@dataclass
class AuditEntry:
    item: ItemRef
    actor: str
    action: str
    detail: dict[str, str | bool | int | None] = field(default_factory=dict)


# How much of a typed reviewer label a decision keeps (the workflow cuts it; the proof covers
# the cut label).
REVIEWER_LABEL_CHARS = 200


@dataclass
class DecisionBody:
    """What a reviewer sends with a decision (the body of each decision update; signals take
    the same fields as a JSON object). `reviewer` and `wait_id` are required; `evidence` for
    `resolve`; `send_followup: false` on `approve` continues without the follow-up."""

    reviewer: str = ""
    wait_id: str = ""
    note: str | None = None
    evidence: str | None = None
    corrections: dict[str, str] = field(default_factory=dict)
    send_followup: bool = True
    # Set by the desk and the CLI (docs/architecture.md §6): the authenticated decider, the
    # path it came through (desk | cli) and an HMAC proof over the whole decision (this body,
    # the workflow ID, the wait and the action) that the bookkeeping activity verifies. Wrong:
    # the decision is refused. Absent: refused in production, otherwise recorded with the
    # identity Temporal recorded for the request.
    decider: str = ""
    path: str = ""
    proof: str = ""
    # `approve` of an edited draft (docs/architecture.md §6, "Edited drafts"): the SHA-256 of
    # the text the desk or the CLI stored with the intent. The text itself never travels here.
    draft_sha256: str | None = None


@dataclass
class ReviewDecision:
    """A validated decision. `reviewer` is required (a display label once decisions are
    attributed from authentication: the workflow replaces it with the verified decider)."""

    action: DecisionAction
    reviewer: str
    note: str | None = None
    evidence: str | None = None
    corrections: dict[str, str] = field(default_factory=dict)
    wait_id: str | None = None      # signals may omit it (bound to the wait open on arrival)
    send_followup: bool = True
    decider: str = ""
    path: str = ""
    proof: str = ""
    draft_sha256: str | None = None    # `approve` of an edited draft: the hash it binds


@dataclass
class DecisionRecord:
    """A decision as the workflow took it, for `record_decision`: the claimed decider and its
    proof, how it arrived (signal or update; the run and the signal's ordinal or the update's
    ID find the request's identity in history), and the audit entry's detail."""

    item: ItemRef
    action: str
    via: str                        # signal | update
    run_id: str
    typed_reviewer: str = ""
    decider: str = ""
    path: str = ""
    proof: str = ""
    wait_id: str = ""               # the open wait the decision was checked against
    signal_seq: int | None = None   # the n-th decision signal of this run
    update_id: str | None = None
    detail: dict[str, str | bool | int | None] = field(default_factory=dict)
    # The rest of the body the proof covers (`reviewer_identity.DecisionClaim`).
    note: str | None = None
    evidence: str | None = None
    corrections: dict[str, str] = field(default_factory=dict)
    send_followup: bool = True
    # The reviewer role the decision needs (the wait is an ambiguous customer-facing send and
    # the policy names `authority.repeat_customer_facing`): a `retry` by anyone else, or
    # without a proof of who decided, is refused.
    required_role: str | None = None
    # A `send_again`: the send operation it repeats (its follow-up must be unconfirmed or
    # sent, and may still be written to), checked as the decision is recorded.
    op_key: str | None = None
    # An approval at a follow-up's wait (patch `edited-draft`): the intent, and the hash of
    # the edited draft it binds (checked against the stored text and the rule's limits).
    intent_id: str | None = None
    draft_sha256: str | None = None


@dataclass
class DecisionIdentity:
    """Who decided, as recorded: the verified decider, or Temporal's identity of the request."""

    decider: str
    path: str
    authenticated: bool = False
    # Set when the workflow must refuse the decision (its proof does not match, or none in
    # production): the audit's reason code and what the person reads. An answer recorded
    # before issue 36 has neither, so its history replays as it ran.
    refused: str = ""
    refusal: str = ""


@dataclass
class ResolveInput:
    item: ItemRef
    op_key: str
    reviewer: str
    evidence: str


@dataclass
class CorrectionInput:
    item: ItemRef
    reviewer: str
    corrections: dict[str, str] = field(default_factory=dict)


@dataclass
class RetryGrant:
    item: ItemRef
    op_key: str
    reviewer: str
    budget: int


@dataclass
class SendAgainInput:
    """A person's deliberate second send of the follow-up behind `op_key` (the send whose
    outcome is unconfirmed or known): a new intent of `generation`, approved by `reviewer`
    for `reason`."""

    item: ItemRef
    op_key: str
    reviewer: str
    reason: str
    generation: int
    max_attempts: int
    # The first send is logged in the CRM once sent (`crm-sent`): so is the new one.
    logs_sent: bool = False


@dataclass
class SendAgainResult:
    """The new intent and the keys of its send and of its log in the CRM."""

    intent_id: str
    send_op_key: str
    sent_op_key: str | None = None


@dataclass
class EscalationInput:
    item: ItemRef
    reason: str


@dataclass
class IntentApproval:
    item: ItemRef
    intent_id: str
    reviewer: str
    # The edited draft the approval binds (its SHA-256); None: the rendered words.
    draft_sha256: str | None = None


@dataclass
class IntentDecline:
    """A reviewer approved the item but not its follow-up: the intent is cancelled."""

    item: ItemRef
    intent_id: str
    op_key: str
    reviewer: str


@dataclass
class OperationView:
    """The ledger's view of one operation, for the current details of a blocked step."""

    attempts: int = 0
    max_attempts: int = 0
    last_error: str | None = None   # a payload-free label, e.g. http_400:VALIDATION_ERROR


@dataclass
class OpenReview:
    """The wait a person is asked to answer: why, who owns it, since when, what is allowed."""

    reason: str
    owner: str
    since: str
    allowed: list[str]
    op_key: str | None = None
    wait_id: str = ""
    escalate_at: str = ""
    needs_sender: bool = False
    intent_id: str | None = None    # the follow-up an approval of this wait approves
    error: str | None = None        # the destination's error, for a blocked step
    # The reviewer role a `retry` needs here (an ambiguous customer-facing send whose policy
    # names one), so the desk and the CLI refuse others before sending anything.
    repeat_role: str | None = None
    # The reviewer role an approval of this follow-up needs (`authority.approve_followup`).
    approve_role: str | None = None


@dataclass
class ItemStatus:
    """The `status` query's answer and the workflow's result: state, reason, operation keys
    with destination IDs, and the open review if any."""

    workflow_id: str
    event_id: str | None = None
    tenant: str | None = None
    state: str = ItemState.RECEIVED.value
    reason: str | None = None
    operations: dict[str, OperationStatus] = field(default_factory=dict)
    review: OpenReview | None = None
