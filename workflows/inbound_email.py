"""InboundEmailWorkflow: one inbound email, from extraction to a single follow-up.

Reads like the state table of DESIGN.md section 3:

    received → extracting → [awaiting_review] → matching → crm_pending → send_pending → completed
    parked:   ignored · suppressed · rejected · blocked · ambiguous · held

Deterministic orchestration only: every read and write happens in an activity, every side
effect has its own operation key, and whenever software cannot decide (a review reason, a
permanent error, an unconfirmed side effect) the item waits here for a person's signal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.crm import CrmActivities
    from activities.errors import ErrorType
    from activities.extract import ExtractActivities
    from activities.match import MatchActivities
    from activities.review import ReviewActivities
    from activities.send import SendActivities
    from schemas.models import (
        REVIEW_STATES,
        AuditEntry,
        CorrectionInput,
        EscalationInput,
        ExtractResult,
        InboundEmailInput,
        IntentApproval,
        ItemRef,
        ItemState,
        OperationInput,
        OperationResult,
        PlanInput,
        PlanResult,
        ResolveInput,
        RetryGrant,
        ReviewDecision,
        StateChange,
    )

# --- Search attributes (registered by `make up` / the worker at start) -------------------
SA_STATE = SearchAttributeKey.for_keyword("InboxState")
SA_REVIEW_REASON = SearchAttributeKey.for_keyword("ReviewReason")
SA_REVIEW_OWNER = SearchAttributeKey.for_keyword("ReviewOwner")
SA_TENANT = SearchAttributeKey.for_keyword("Tenant")
SA_NEEDS_REVIEW = SearchAttributeKey.for_bool("NeedsReview")
SA_OVERDUE = SearchAttributeKey.for_bool("ReviewOverdue")

# --- Retry policies: bounded everywhere, each with the reason beside it -----------------
NON_RETRYABLE = [ErrorType.PERMANENT.value, ErrorType.AMBIGUOUS.value]

# Extraction reads Postgres and maybe an LLM: a few quick retries for blips and 429s.
EXTRACT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(
    seconds=30), maximum_attempts=5, non_retryable_error_types=NON_RETRYABLE)
# Planning is one DB transaction: retry conflicts/outages briefly (an opt-out also waits here,
# ≤5 s at a time, for a send already on the wire: up to one send lease), then a person looks.
PLAN_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(
    seconds=20), maximum_attempts=8, non_retryable_error_types=NON_RETRYABLE)
# CRM calls: rate limits and outages clear within minutes; the ledger enforces the same cap.
CRM_MAX_ATTEMPTS = 6
CRM_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                        maximum_interval=timedelta(seconds=60),
                        maximum_attempts=CRM_MAX_ATTEMPTS, non_retryable_error_types=NON_RETRYABLE)
# Mail provider: same shape as the CRM; the idempotency key makes every retry safe.
SEND_MAX_ATTEMPTS = 6
SEND_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                         maximum_interval=timedelta(seconds=60),
                         maximum_attempts=SEND_MAX_ATTEMPTS,
                         non_retryable_error_types=NON_RETRYABLE)
# Bookkeeping writes (state, audit, review tasks) are idempotent single statements.
BOOKKEEPING_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                                maximum_interval=timedelta(seconds=30), maximum_attempts=20)

# Worst case of the LLM extractor: its own bounded retries of a 30 s call.
EXTRACT_TIMEOUT = timedelta(seconds=120)
PLAN_TIMEOUT = timedelta(seconds=30)
# Outlives the adapter's HTTP timeout plus one reconciliation lookup.
OPERATION_TIMEOUT = timedelta(seconds=25)
BOOKKEEPING_TIMEOUT = timedelta(seconds=10)
# Activities heartbeat every 2 s: a killed worker's attempt is retried after this, not after
# the start-to-close timeout.
HEARTBEAT_TIMEOUT = timedelta(seconds=10)
# While a tenant's CRM or send switch is paused, the step is re-checked: first after
# PAUSE_POLL, then backing off to PAUSE_POLL_MAX so a long pause cannot bloat the history
# (a day costs ~1.5k timers, not 17k).
PAUSE_POLL = timedelta(seconds=5)
PAUSE_POLL_MAX = timedelta(seconds=60)

REVIEW_ACTIONS = {"approve", "hold", "reject"}
RECOVERY_ACTIONS = {"retry", "resolve", "hold", "reject"}
DECISION_FIELDS = {"reviewer", "note", "evidence", "corrections"}


@dataclass
class _Signal:
    action: str
    body: Any


@dataclass
class _Waiting:
    kind: str                      # review | recovery
    reason: str
    allowed: set[str]
    op_key: str | None = None
    since: str = ""


@dataclass
class _Status:
    state: str = ItemState.RECEIVED.value
    reason: str | None = None
    operations: dict[str, dict[str, str | None]] = field(default_factory=dict)


class Rejected(Exception):
    """A reviewer rejected the item: the run ends in `rejected`."""


@workflow.defn(name="InboundEmailWorkflow")
class InboundEmailWorkflow:
    def __init__(self) -> None:
        self._status = _Status()
        self._item: ItemRef | None = None
        self._signals: list[_Signal] = []
        self._waiting: _Waiting | None = None
        self._owner = "sales-ops"
        self._escalation_hours = 24.0
        # What the search attributes already say: upsert only changes (each upsert is a
        # history event and a visibility write).
        self._shown_state: str | None = None
        self._shown_review = False

    # --- the steps -----------------------------------------------------------------------
    @workflow.run
    async def run(self, params: InboundEmailInput) -> dict[str, Any]:
        self._item = ItemRef(event_id=params.event_id, workflow_id=workflow.info().workflow_id,
                             tenant=params.tenant)
        try:
            await self._process()
        except Rejected:
            await self._enter(ItemState.REJECTED, "reviewer_rejected")
        return self.status()

    async def _process(self) -> None:
        self._show(ItemState.EXTRACTING, extra=[SA_TENANT.value_set(self.item.tenant)])
        extraction: ExtractResult = await self._step(
            ExtractActivities.extract_message, self.item, EXTRACT_TIMEOUT, EXTRACT_RETRY)
        self._owner = extraction.review_owner
        self._escalation_hours = extraction.escalation_hours
        if extraction.route == "ignore":
            await self._enter(ItemState.IGNORED, _first(extraction.reasons, "ignored"))
            return
        approved_by: str | None = None
        if extraction.route == "review":
            approved_by = await self._review(_first(extraction.reasons, "extraction_review"))

        plan = await self._plan(approved_by)
        while plan.outcome == "review":
            approved_by = await self._review(plan.reason or "match_review")
            plan = await self._plan(approved_by)
        if plan.outcome == "opted_out":
            await self._enter(ItemState.SUPPRESSED, plan.reason)
            return

        assert plan.crm_op_key is not None
        await self._operation(CrmActivities.upsert_contact_in_crm, plan.crm_op_key,
                              ItemState.CRM_PENDING, CRM_RETRY)
        # Added while workflows were running: their histories have no note step.
        if plan.note_op_key and workflow.patched("crm-note"):
            await self._operation(CrmActivities.log_email_on_contact, plan.note_op_key,
                                  ItemState.CRM_PENDING, CRM_RETRY)
        if plan.send_op_key is None or plan.intent_id is None:
            final = ItemState.SUPPRESSED if plan.reason == "suppressed" else ItemState.COMPLETED
            await self._enter(final, plan.reason or "no_followup")
            return
        if plan.intent_needs_approval:
            reviewer = await self._review("followup_approval_required")
            await self._bookkeeping(ReviewActivities.approve_followup_intent,
                                    IntentApproval(self.item, plan.intent_id, reviewer))
        sent = await self._operation(SendActivities.submit_followup_email, plan.send_op_key,
                                     ItemState.SEND_PENDING, SEND_RETRY)
        if sent.status == "cancelled":
            await self._enter(ItemState.SUPPRESSED, sent.reason)
            return
        await self._enter(ItemState.COMPLETED, "followup_sent")

    async def _plan(self, approved_by: str | None) -> PlanResult:
        self._show(ItemState.MATCHING)
        plan: PlanResult = await self._step(
            MatchActivities.match_and_plan, PlanInput(self.item, approved_by), PLAN_TIMEOUT,
            PLAN_RETRY)
        for action, key in (("crm-upsert", plan.crm_op_key), ("crm-note", plan.note_op_key),
                            ("send", plan.send_op_key)):
            if key:
                self._status.operations.setdefault(action, {"op_key": key, "status": "pending",
                                                            "destination_id": None})
        return plan

    async def _step(self, fn: Any, arg: Any, timeout: timedelta, retry: RetryPolicy) -> Any:
        """A non-outbox step; if it cannot finish, a person decides (retry or reject)."""
        while True:
            try:
                return await workflow.execute_activity_method(
                    fn, arg, start_to_close_timeout=timeout, retry_policy=retry,
                    heartbeat_timeout=HEARTBEAT_TIMEOUT)
            except ActivityError as err:
                await self._recover(err, op_key=None)

    async def _operation(self, fn: Any, op_key: str, state: ItemState,
                         retry: RetryPolicy) -> OperationResult:
        """An outbox operation: parks while paused, waits for a person when it cannot be
        completed or confirmed, and never runs again once completed."""
        action = op_key.rsplit(":", 1)[-1]
        op = OperationInput(self.item, op_key)
        pause_poll = PAUSE_POLL
        while True:
            self._show(state)
            try:
                result: OperationResult = await workflow.execute_activity_method(
                    fn, op, start_to_close_timeout=OPERATION_TIMEOUT, retry_policy=retry,
                    heartbeat_timeout=HEARTBEAT_TIMEOUT)
            except ActivityError as err:
                self._status.operations[action]["status"] = "failed"
                if await self._recover(err, op_key=op_key) == "resolved":
                    self._status.operations[action]["status"] = "completed"
                    return OperationResult(status="completed", reason="resolved_by_reviewer")
                continue
            if result.status == "parked":
                self._show(state, "paused")
                await workflow.sleep(pause_poll)
                # Introduced while workflows were running: old histories keep the fixed poll.
                if workflow.patched("pause-poll-backoff"):
                    pause_poll = min(pause_poll * 2, PAUSE_POLL_MAX)
                continue
            self._status.operations[action].update(
                status=result.status, destination_id=result.destination_id)
            return result

    # --- people in the loop --------------------------------------------------------------
    async def _recover(self, err: ActivityError, op_key: str | None) -> str:
        """Park a failed step for a person. Returns 'retry' or 'resolved'."""
        cause = err.cause
        error_type = cause.type if isinstance(cause, ApplicationError) else None
        if error_type == ErrorType.AMBIGUOUS.value:
            state, reason = ItemState.AMBIGUOUS, "outcome_unconfirmed"
        elif isinstance(cause, ApplicationError) and error_type == ErrorType.PERMANENT.value:
            state, reason = ItemState.BLOCKED, _reason_of(cause)
        else:
            state, reason = ItemState.BLOCKED, "retries_exhausted"
        allowed = set(RECOVERY_ACTIONS) if op_key else RECOVERY_ACTIONS - {"resolve"}
        decision = await self._wait_for_person(
            _Waiting("recovery", reason, allowed, op_key), state)
        if decision.action == "resolve":
            assert op_key is not None
            await self._bookkeeping(ReviewActivities.resolve_operation, ResolveInput(
                self.item, op_key, decision.reviewer, decision.evidence or ""))
            return "resolved"
        if op_key:
            budget = SEND_MAX_ATTEMPTS if op_key.endswith(":send") else CRM_MAX_ATTEMPTS
            await self._bookkeeping(ReviewActivities.grant_operation_retry,
                                    RetryGrant(self.item, op_key, decision.reviewer, budget))
        return "retry"

    async def _review(self, reason: str) -> str:
        """Wait for approve/reject; apply corrected fields. Returns the approving reviewer."""
        decision = await self._wait_for_person(
            _Waiting("review", reason, set(REVIEW_ACTIONS)), ItemState.AWAITING_REVIEW)
        if decision.corrections:
            await self._bookkeeping(ReviewActivities.apply_review_corrections,
                                    CorrectionInput(self.item, decision.reviewer,
                                                    dict(decision.corrections)))
        return decision.reviewer

    async def _wait_for_person(self, waiting: _Waiting, state: ItemState) -> ReviewDecision:
        waiting.since = workflow.now().isoformat()
        self._waiting = waiting
        workflow.set_current_details(_details(waiting, state))
        await self._enter(state, waiting.reason, review=True)
        deadline = timedelta(hours=self._escalation_hours)
        while True:
            try:
                await workflow.wait_condition(lambda: bool(self._signals), timeout=deadline)
            except TimeoutError:
                await self._escalate(waiting.reason)
                deadline = timedelta(days=3650)
                continue
            decision = await self._take_decision(waiting)
            if decision is None:
                continue
            if decision.action == "hold":
                await self._enter(ItemState.HELD, waiting.reason, review=True)
                continue
            self._waiting = None
            if decision.action == "reject":
                raise Rejected()  # run() records `rejected`, which leaves the review
            self._leave_review()
            return decision

    async def _take_decision(self, waiting: _Waiting) -> ReviewDecision | None:
        """Validate the oldest signal; record it either way. Invalid bodies never crash."""
        signal = self._signals.pop(0)
        decision, problem = _parse_decision(signal)
        if decision is not None:
            if decision.action not in waiting.allowed:
                problem = f"not_allowed_while_{waiting.kind}"
            elif decision.action == "resolve" and not decision.evidence:
                problem = "evidence_required"
        accepted = problem is None
        await self._bookkeeping(ReviewActivities.record_audit, AuditEntry(
            self.item, decision.reviewer if decision else "unknown", f"signal_{signal.action}",
            {"accepted": accepted, "ignored_reason": problem,
             "note": decision.note if decision else None, "waiting_for": waiting.reason}))
        return decision if accepted else None

    async def _escalate(self, reason: str) -> None:
        workflow.upsert_search_attributes([SA_OVERDUE.value_set(True)])
        await self._bookkeeping(ReviewActivities.mark_review_escalated,
                                EscalationInput(self.item, reason))

    # --- signals and query ---------------------------------------------------------------
    @workflow.signal(name="approve", description=(
        "Approve an item awaiting review; processing continues. Body: {\"reviewer\": "
        "\"name\" (required), \"note\": \"...\", \"corrections\": {\"sender_email\": \"...\", "
        "\"name\": \"...\", \"company\": \"...\"}}"))
    def approve(self, body: Any) -> None:
        self._signals.append(_Signal("approve", body))

    @workflow.signal(name="hold", description=(
        "Park the item (state held) until another decision; it stays in the review queue. "
        "Body: {\"reviewer\": \"name\" (required), \"note\": \"...\"}"))
    def hold(self, body: Any) -> None:
        self._signals.append(_Signal("hold", body))

    @workflow.signal(name="reject", description=(
        "Reject the item: it ends as rejected and nothing more is written or sent. "
        "Body: {\"reviewer\": \"name\" (required), \"note\": \"...\"}"))
    def reject(self, body: Any) -> None:
        self._signals.append(_Signal("reject", body))

    @workflow.signal(name="retry", description=(
        "Blocked or ambiguous step: run it again with the same operation key and a fresh, "
        "bounded attempt budget. Body: {\"reviewer\": \"name\" (required), \"note\": \"...\"}"))
    def retry(self, body: Any) -> None:
        self._signals.append(_Signal("retry", body))

    @workflow.signal(name="resolve", description=(
        "Blocked or ambiguous side effect already exists: mark it complete with evidence "
        "(e.g. the CRM record ID) and continue. Body: {\"reviewer\": \"name\" (required), "
        "\"evidence\": \"...\" (required), \"note\": \"...\"}"))
    def resolve(self, body: Any) -> None:
        self._signals.append(_Signal("resolve", body))

    @workflow.query(name="status", description=(
        "State, reason, operation keys and destination IDs, and the open review (if any)."))
    def status(self) -> dict[str, Any]:
        waiting = self._waiting
        return {
            "workflow_id": workflow.info().workflow_id,
            "event_id": self._item.event_id if self._item else None,
            "tenant": self._item.tenant if self._item else None,
            "state": self._status.state,
            "reason": self._status.reason,
            "operations": self._status.operations,
            "review": None if waiting is None else {
                "reason": waiting.reason, "owner": self._owner, "since": waiting.since,
                "allowed": sorted(waiting.allowed), "op_key": waiting.op_key},
        }

    # --- state mirroring -----------------------------------------------------------------
    @property
    def item(self) -> ItemRef:
        assert self._item is not None
        return self._item

    def _show(self, state: ItemState, reason: str | None = None,
              extra: list[SearchAttributeUpdate[Any]] | None = None) -> None:
        """Set the state in the query and search attributes (no I/O)."""
        self._status.state = state.value
        self._status.reason = reason
        updates = list(extra or [])
        if self._shown_state != state.value:
            updates.append(SA_STATE.value_set(state.value))
            self._shown_state = state.value
        if updates:
            workflow.upsert_search_attributes(updates)

    async def _enter(self, state: ItemState, reason: str | None, review: bool = False) -> None:
        """A state the workflow itself decides: mirrored to PostgreSQL and the UI."""
        updates: list[SearchAttributeUpdate[Any]] = []
        if state in REVIEW_STATES:
            updates = [SA_NEEDS_REVIEW.value_set(True),
                       SA_REVIEW_REASON.value_set(reason or state.value),
                       SA_REVIEW_OWNER.value_set(self._owner)]
            self._shown_review = True
        else:
            updates = self._leave_review_updates()
        self._show(state, reason, updates)
        waiting = self._waiting
        await self._bookkeeping(ReviewActivities.record_item_state, StateChange(
            self.item, state.value, reason,
            review_reason=reason if review else None,
            review_owner=self._owner if review else None,
            destination_ref=waiting.op_key if waiting else None,
            escalation_hours=self._escalation_hours))

    def _leave_review(self) -> None:
        updates = self._leave_review_updates()
        if updates:
            workflow.upsert_search_attributes(updates)

    def _leave_review_updates(self) -> list[SearchAttributeUpdate[Any]]:
        """Clear the review marks if they are set (nothing otherwise)."""
        if not self._shown_review:
            return []
        self._shown_review = False
        workflow.set_current_details("")
        return [SA_NEEDS_REVIEW.value_set(False), SA_OVERDUE.value_set(False)]

    async def _bookkeeping(self, fn: Any, arg: Any) -> Any:
        return await workflow.execute_local_activity_method(
            fn, arg, start_to_close_timeout=BOOKKEEPING_TIMEOUT, retry_policy=BOOKKEEPING_RETRY)


_CHOICES = {
    "approve": "approve: continue processing (optionally with corrected fields)",
    "hold": "hold: keep it parked in the queue",
    "reject": "reject: end it; nothing more is written or sent",
    "retry": "retry: run the step again with the same operation key",
    "resolve": "resolve: the side effect exists; record the evidence and continue",
}


def _details(waiting: _Waiting, state: ItemState) -> str:
    """What the UI shows on the workflow page: why it waits and what each choice does.
    References and reasons only, never personal data."""
    lines = [f"**Waiting for a person** ({state.value}): `{waiting.reason}`"]
    if waiting.op_key:
        lines.append(f"Operation: `{waiting.op_key.rsplit(':', 1)[-1]}`")
    lines.append("Send a signal with body `{\"reviewer\": \"your name\", \"note\": \"...\"}`:")
    lines += [f"- {_CHOICES[action]}" for action in sorted(waiting.allowed)]
    return "\n".join(lines)


def _first(reasons: list[str], default: str) -> str:
    return reasons[0] if reasons else default


def _reason_of(cause: ApplicationError) -> str:
    """'permanent: http_400:VALIDATION_ERROR' → 'http_400:VALIDATION_ERROR'."""
    return cause.message.split(": ", 1)[-1] or "permanent_error"


def _parse_decision(signal: _Signal) -> tuple[ReviewDecision | None, str | None]:
    body = signal.body
    if not isinstance(body, dict):
        return None, "body_not_an_object"
    unknown = set(body) - DECISION_FIELDS
    if unknown:
        return None, "unknown_fields"
    reviewer = body.get("reviewer")
    if not isinstance(reviewer, str) or not reviewer.strip():
        return None, "reviewer_required"
    corrections = body.get("corrections") or {}
    if not isinstance(corrections, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in corrections.items()
    ):
        return None, "corrections_not_string_map"
    for name in ("note", "evidence"):
        if body.get(name) is not None and not isinstance(body[name], str):
            return None, f"{name}_not_a_string"
    return ReviewDecision(action=signal.action, reviewer=reviewer.strip()[:200],
                          note=body.get("note"), evidence=body.get("evidence"),
                          corrections=corrections), None
