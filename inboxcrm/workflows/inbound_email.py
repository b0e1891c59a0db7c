"""InboundEmailWorkflow: one inbound email, from extraction to a single follow-up.

Reads like the state table of docs/architecture.md §3:

    received → extracting → [awaiting_review] → matching → crm_pending → send_pending → completed
    parked:   ignored · suppressed · rejected · blocked · ambiguous · held
    shadow:   received → extracting → matching → shadowed (planned; nothing written or sent)

Deterministic orchestration only: every read and write happens in an activity, every side
effect has its own operation key, and whenever software cannot decide (a review reason, a
permanent error, an unconfirmed side effect) the item waits here for a person's signal.

Only the workflow class lives here: the sandbox re-executes this file for every workflow run,
so the constants (`step_options`) and the reviewer-decision helpers (`decisions`) are
passthrough modules, loaded once per worker. For the same reason this file has no
`from __future__ import annotations`: string annotations would be evaluated again for every
run when the SDK reads the signal and query signatures.
"""


import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from inboxcrm.activities.bookkeeping import BookkeepingActivities
    from inboxcrm.activities.crm import CrmActivities
    from inboxcrm.activities.extract import ExtractActivities
    from inboxcrm.activities.match import MatchActivities
    from inboxcrm.activities.review import ReviewActivities
    from inboxcrm.activities.send import SendActivities
    from inboxcrm.activities.shadow import ShadowActivities
    from inboxcrm.schemas.contract import (
        DECISION_REFUSED,
        QUERY_STATUS,
        SA_NEEDS_REVIEW,
        SA_OVERDUE,
        SA_REVIEW_OWNER,
        SA_REVIEW_REASON,
        SA_STATE,
        SA_TENANT,
        SIGNAL_WAKE,
        WORKFLOW_TYPE,
        Decision,
    )
    from inboxcrm.schemas.models import (
        REVIEW_STATES,
        CorrectionInput,
        DecisionBody,
        DecisionRecord,
        EscalationInput,
        InboundEmailInput,
        IntentApproval,
        IntentDecline,
        ItemEnd,
        ItemRef,
        ItemState,
        ItemStatus,
        OpenReview,
        OperationInput,
        OperationResult,
        OperationStatus,
        PlanInput,
        PlanResult,
        ResolveInput,
        RetryGrant,
        ReviewDecision,
        SendAgainInput,
        StateChange,
        WorkflowState,
    )
    from inboxcrm.schemas.outcomes import ErrorType
    from inboxcrm.workflows.decisions import (
        NEEDS_SENDER,
        RECOVERY_ACTIONS,
        REVIEW_ACTIONS,
        SEND_AGAIN,
        WAIT_BARRIER,
        Refusal,
        Rejected,
        Request,
        Waiting,
        WaitKind,
        customer_facing,
        details,
        first,
        owner_of,
        parse_decision,
        reason_of,
        refusal,
        signal_description,
        update_description,
    )
    from inboxcrm.workflows.step_options import (
        BOOKKEEPING_RETRY,
        BOOKKEEPING_TIMEOUT,
        CRM_MAX_ATTEMPTS,
        CRM_RETRY,
        DRAIN_HANDOVER,
        EXTRACT_RETRY,
        EXTRACT_TIMEOUT,
        HEARTBEAT_TIMEOUT,
        HISTORY_LIMIT,
        OPERATION_TIMEOUT,
        PARK_END_MIN,
        PARK_END_SPREAD,
        PAUSE_FALLBACK_MAX,
        PAUSE_POLL,
        PLAN_RETRY,
        PLAN_TIMEOUT,
        SEND_MAX_ATTEMPTS,
        SEND_RETRY,
        SHADOW_PLAN_TIMEOUT,
        STEP_FAILURES,
        STORE_WAIT_FIRST,
        STORE_WAIT_MAX,
        WAIT_JITTER,
        destination_retry,
        is_store_outage,
        is_worker_draining,
    )

__all__ = ["CRM_MAX_ATTEMPTS", "SEND_MAX_ATTEMPTS", "InboundEmailWorkflow"]

# The release's one patch marker (docs/architecture.md §5, "Workflow versions"): it stood for
# the twelve patches of 0.2, whose old branches are retired. A run records it first thing;
# every history this code replays carries it. Deprecated: its marker is what a run of 0.2
# has, the call goes once no run without a deprecated marker is open.
PATCHES_OF_0_2 = "patches-of-0.2"
# The conversation in the CRM (docs/architecture.md §5): the inbound email and the sent
# follow-up logged as the CRM's email activities, each its own operation. Asked only for a
# plan that has their keys, so a plan made before them asks nothing and replays as it ran.
CONVERSATION_IN_CRM = "conversation-in-crm"
# A deliberate second send (docs/architecture.md §6, "Authority"): an unconfirmed follow-up
# send's wait also offers `send_again`. Asked where such a wait opens, so a run that opened
# one before it replays with the four recovery decisions it offered.
SEND_AGAIN_PATCH = "send-again"
# Drafts a reviewer can edit (docs/architecture.md §6, "Edited drafts"): a follow-up's
# approval may bind an edited draft (its hash), and only the policy's approver role may
# approve. Asked where a follow-up's approval wait opens, so a run that opened one before it
# replays as it ran (any reviewer, the rendered words).
EDITED_DRAFT_PATCH = "edited-draft"

# A step keeps its activity's signature: `fn(self, arg) -> result` in, `result` out.
Owner = TypeVar("Owner")
Arg = TypeVar("Arg")
Result = TypeVar("Result")
Step = Callable[[Owner, Arg], Awaitable[Result]]


@workflow.defn(name=WORKFLOW_TYPE)
class InboundEmailWorkflow:
    def __init__(self) -> None:
        # The item's state that outlives a run, handed whole to a continuation
        # (`_continue_if_long`): the plan, the operations, the people-in-the-loop state.
        self._state = WorkflowState()
        # The rest is this run's own.
        self._status = ItemStatus(workflow_id="")   # state and reason (the query's)
        self._item: ItemRef | None = None
        self._requests: list[Request] = []
        self._decision_signals = 0          # ordinal of each decision signal in this run
        self._waiting: Waiting | None = None
        # What the search attributes already say: upsert only changes (each upsert is a
        # history event and a visibility write), and the state only where an item may stay
        # for long (see `_show`).
        self._shown_state: str | None = None
        self._shown_review = False
        # Durable-for-days: a pending wake-up from `inboxcrm resume`, and how long the next
        # store wait is.
        self._woken = False
        self._store_wait = STORE_WAIT_FIRST

    # --- the steps -----------------------------------------------------------------------
    @workflow.run
    async def run(self, params: InboundEmailInput) -> ItemStatus:
        self._item = ItemRef(event_id=params.event_id, workflow_id=workflow.info().workflow_id,
                             tenant=params.tenant)
        self._status = ItemStatus(workflow_id=self._item.workflow_id,
                                  event_id=params.event_id, tenant=params.tenant)
        workflow.deprecate_patch(PATCHES_OF_0_2)
        try:
            if params.carried is None:
                await self._process()
            else:
                await self._resume_carried(params.carried)
        except Rejected:
            await self._enter(ItemState.REJECTED, "reviewer_rejected")
        # An update that was just answered returns its result before the run ends.
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    async def _process(self) -> None:
        # A run started with its tenant and first state (`start_search_attributes`) already
        # shows them; one started without them (an older relay) upserts them. (Builds before
        # PATCHES_OF_0_2 upserted them anyway; their runs are retired, docs/architecture.md
        # §5.)
        given = workflow.info().typed_search_attributes
        started_with = (given.get(SA_TENANT) == self.item.tenant
                        and given.get(SA_STATE) == ItemState.EXTRACTING.value)
        if started_with:
            self._shown_state = ItemState.EXTRACTING.value
        self._show(ItemState.EXTRACTING, publish=True,
                   extra=None if started_with else [SA_TENANT.value_set(self.item.tenant)])
        extraction = await self._step(
            ExtractActivities.extract_message, self.item, EXTRACT_TIMEOUT, EXTRACT_RETRY,
            summary="extract")
        if extraction.model_queue:
            # The LLM extractor: the model call is a regular activity on its own, rate-limited
            # task queue (docs/architecture.md §5).
            extraction = await self._step(
                ExtractActivities.extract_with_model, self.item, EXTRACT_TIMEOUT,
                EXTRACT_RETRY, summary="extract with model", task_queue=extraction.model_queue)
        self._state.owner = extraction.review_owner
        self._state.owners = dict(extraction.owners)
        self._state.repeat_role = extraction.repeat_role
        self._state.approve_role = extraction.approve_role
        self._state.escalation_hours = extraction.escalation_hours
        self._state.identity_known = extraction.identity_known
        if extraction.review_base_url:
            self._state.card_url = (f"{extraction.review_base_url}/review/"
                                    f"{quote(self.item.workflow_id, safe='')}")
        # Only items of a tenant in shadow mode take it.
        if extraction.shadow:
            await self._shadow()
            return
        if extraction.route == "ignore":
            await self._enter(ItemState.IGNORED, first(extraction.reasons, "ignored"))
            return
        approved_by: str | None = None
        if extraction.route == "review":
            approved_by = (await self._review(
                first(extraction.reasons, "extraction_review"))).reviewer

        plan = await self._plan(approved_by)
        while plan.outcome == "review":
            approved_by = (await self._review(plan.reason or "match_review")).reviewer
            plan = await self._plan(approved_by)
        self._state.approved_by = approved_by
        if plan.outcome == "opted_out":
            await self._enter(ItemState.SUPPRESSED, plan.reason)
            return
        await self._carry_out(plan)

    async def _shadow(self) -> None:
        """A tenant in shadow mode (docs/architecture.md §6, "Going live"): the plan is
        worked out and stored on the event; nothing is written to a destination, nothing is
        sent and nobody is asked. The item ends `shadowed`, its outcome as the reason."""
        planned = await self._step(
            ShadowActivities.plan_in_shadow, self.item, SHADOW_PLAN_TIMEOUT, PLAN_RETRY,
            summary="shadow-plan")
        await self._enter(ItemState.SHADOWED, planned.outcome)

    async def _resume_carried(self, carried: WorkflowState) -> None:
        """A continuation (continue-as-new) takes the state whole and picks up after
        planning: completed operations answer from the ledger at once, the rest run as they
        would have."""
        self._state = carried
        assert carried.plan is not None
        await self._carry_out(carried.plan)

    async def _carry_out(self, plan: PlanResult) -> None:
        self._state.plan = plan
        assert plan.crm_op_key is not None
        # The item's last step records the item's end with its own success (§3 of
        # docs/architecture.md): the CRM's last step when no follow-up is planned, else the
        # send.
        end = None if plan.send_op_key and plan.intent_id else _end_without_followup(plan)
        logs_email = bool(plan.email_op_key) and workflow.patched(CONVERSATION_IN_CRM)
        # The tenant's retry settings as planned (policy `retries`); a plan made before them
        # carries none and runs with the defaults it ran with.
        crm_retry = CRM_RETRY if plan.crm_retry is None else destination_retry(plan.crm_retry)
        send_retry = (SEND_RETRY if plan.send_retry is None
                      else destination_retry(plan.send_retry))
        last = await self._operation(CrmActivities.upsert_contact_in_crm, plan.crm_op_key,
                                     ItemState.CRM_PENDING, crm_retry,
                                     ends=None if plan.note_op_key or logs_email else end)
        if plan.note_op_key:
            last = await self._operation(CrmActivities.log_email_on_contact, plan.note_op_key,
                                         ItemState.CRM_PENDING, crm_retry,
                                         ends=None if logs_email else end)
        if logs_email:
            assert plan.email_op_key is not None
            last = await self._operation(CrmActivities.log_inbound_email_in_crm,
                                         plan.email_op_key, ItemState.CRM_PENDING, crm_retry,
                                         ends=end)
        if end is not None:
            await self._ended(end, last)
            return
        assert plan.send_op_key is not None and plan.intent_id is not None
        if not self._state.send_followup:
            await self._decline_followup(plan, self._state.approved_by or "reviewer")
            return
        if plan.intent_needs_approval:
            # `ramp_limit`: a first live run's hourly cap held it (docs/architecture.md §6).
            drafts = workflow.patched(EDITED_DRAFT_PATCH)
            approval = await self._review(plan.approval_reason or "followup_approval_required",
                                          kind="followup", intent_id=plan.intent_id,
                                          required_role=(self._state.approve_role
                                                         if drafts else None), drafts=drafts)
            if not approval.send_followup:
                await self._decline_followup(plan, approval.reviewer)
                return
            await self._bookkeeping(ReviewActivities.approve_followup_intent, IntentApproval(
                self.item, plan.intent_id, approval.reviewer,
                draft_sha256=approval.draft_sha256 if drafts else None))
            plan.intent_needs_approval = False  # a continuation must not ask again
        sent_end = ItemEnd(ItemState.COMPLETED.value, "followup_sent")
        # With the conversation in the CRM the follow-up's log is the last step, after the
        # send (the same patch: a plan has both keys or neither of them).
        logs_sent = logs_email and bool(plan.sent_op_key)
        sent = await self._operation(SendActivities.submit_followup_email, plan.send_op_key,
                                     ItemState.SEND_PENDING, send_retry,
                                     ends=None if logs_sent else sent_end)
        if sent.status == "cancelled":
            await self._enter(ItemState.SUPPRESSED, sent.reason)
            return
        if logs_sent:
            assert plan.sent_op_key is not None
            sent = await self._operation(CrmActivities.log_followup_in_crm, plan.sent_op_key,
                                         ItemState.SEND_PENDING, crm_retry, ends=sent_end)
        await self._ended(sent_end, sent)

    async def _ended(self, end: ItemEnd, last: OperationResult) -> None:
        """The item's end: recorded by its last step's own success, so only the search
        attributes are left to show it; or, for a result the step found already completed
        (a retry, a person's resolve), recorded here."""
        if last.end_recorded:
            self._show(ItemState(end.state), end.reason, self._leave_review_updates(),
                       publish=True)
            return
        await self._enter(ItemState(end.state), end.reason)

    async def _plan(self, approved_by: str | None) -> PlanResult:
        self._show(ItemState.MATCHING)
        plan = await self._step(
            MatchActivities.match_and_plan, PlanInput(self.item, approved_by), PLAN_TIMEOUT,
            PLAN_RETRY, summary="match-and-plan")
        for action, key in (("crm-upsert", plan.crm_op_key), ("crm-note", plan.note_op_key),
                            ("crm-email", plan.email_op_key), ("send", plan.send_op_key),
                            ("crm-sent", plan.sent_op_key)):
            if key:
                self._state.operations.setdefault(action, OperationStatus(op_key=key))
        return plan

    async def _step(self, fn: Step[Owner, Arg, Result], arg: Arg, timeout: timedelta,
                    retry: RetryPolicy, summary: str | None = None,
                    task_queue: str | None = None) -> Result:
        """A non-outbox step; if it cannot finish, a person decides (retry or reject)."""
        while True:
            try:
                return await self._activity(fn, arg, timeout, retry, summary=summary,
                                            task_queue=task_queue)
            except STEP_FAILURES as err:
                if await self._handed_over(err):
                    continue
                if is_store_outage(err):
                    await self._wait_for_store()
                    continue
                await self._recover(err, op_key=None)

    def _budget(self, op_key: str) -> int:
        """The ledger's attempt budget of an operation (and of each reviewer's retry): the
        plan's retry settings (policy `retries`), else the defaults a plan was made with."""
        plan = self._state.plan
        if op_key.endswith(":send"):
            settings = plan.send_retry if plan else None
            return SEND_MAX_ATTEMPTS if settings is None else settings.max_attempts
        settings = plan.crm_retry if plan else None
        return CRM_MAX_ATTEMPTS if settings is None else settings.max_attempts

    async def _operation(self, fn: Step[Owner, OperationInput, OperationResult], op_key: str,
                         state: ItemState, retry: RetryPolicy,
                         ends: ItemEnd | None = None) -> OperationResult:
        """An outbox operation: parks while paused, waits for a person when it cannot be
        completed or confirmed, and never runs again once completed. `ends`: the item's end,
        when this is its last step (recorded with the step's success)."""
        action = op_key.rsplit(":", 1)[-1]
        op = OperationInput(self.item, op_key, ends_item=ends)
        pause_poll = PAUSE_POLL
        while True:
            self._show(state)
            try:
                first = (1, self._budget(op_key))
                attempt, budget = self._state.next_attempt.get(action, first)
                result = await self._activity(fn, op, OPERATION_TIMEOUT, retry,
                                              summary=f"{action} attempt {attempt}/{budget}")
            except STEP_FAILURES as err:
                if await self._handed_over(err):
                    continue
                if is_store_outage(err):
                    await self._wait_for_store()
                    self._continue_if_long()
                    continue
                self._state.operations[action].status = "failed"
                recovered = await self._recover(err, op_key=op_key)
                if recovered == "resolved":
                    self._state.operations[action].status = "completed"
                    return OperationResult(status="completed", reason="resolved_by_reviewer")
                if recovered == SEND_AGAIN:
                    # The new intent's own operation; the first one stays as it was.
                    op_key = self._state.operations[action].op_key
                    op = OperationInput(self.item, op_key, ends_item=ends)
                continue
            if result.status == "parked":
                self._show(state, "paused", publish=True)
                # Woken by `inboxcrm resume` (a signal); the timer is only the fallback.
                self._continue_if_long()
                await self._sleep_unless_woken(_park_wait(pause_poll, result.retry_at))
                pause_poll = min(pause_poll * 2, PAUSE_FALLBACK_MAX)
                continue
            if result.status == "review":
                # Nothing was written (several existing CRM records match): a person
                # decides, then the operation is tried again (reject ends the item).
                self._state.operations[action].status = "review"
                await self._review(result.reason or "operation_review")
                continue
            self._state.operations[action].status = result.status
            self._state.operations[action].destination_id = result.destination_id
            return result

    # --- long waits: pauses, store outages, continue-as-new ------------------------------
    async def _sleep_unless_woken(self, fallback: timedelta) -> None:
        self._woken = False
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(lambda: self._woken, timeout=fallback)

    async def _handed_over(self, err: FailureError) -> bool:
        """The step's worker is shutting down and did not start it
        (`inboxcrm/activities/failures.py`): a short timer ends this workflow task, so the draining
        worker can exit, and the next worker runs the step."""
        if not is_worker_draining(err):
            return False
        await workflow.sleep(DRAIN_HANDOVER)
        return True

    async def _wait_for_store(self) -> None:
        """Capped backoff while the store is unreachable: visible in the query
        (`reason = store_unavailable`) and the worker's metrics (`inboxcrm_store_waits`).
        A wake signal (`inboxcrm resume`) tries again at once."""
        reason = self._status.reason
        self._publish()  # a long wait: `inboxcrm resume` finds it by its state
        self._status.reason = "store_unavailable"
        workflow.metric_meter().create_counter(
            "inboxcrm_store_waits", "Workflow waits for an unreachable store").add(1)
        workflow.logger.warning("store unavailable; waiting %ss",
                                self._store_wait.total_seconds())
        await self._sleep_unless_woken(_jittered(self._store_wait))
        self._store_wait = min(self._store_wait * 2, STORE_WAIT_MAX)
        self._status.reason = reason

    def _continue_if_long(self) -> None:
        """Past HISTORY_LIMIT events (or when the server suggests it) a run that is only
        waiting continues as new with its plan, so no pause or outage outgrows the history.
        Not while a reviewer's decision is still unread or an update is being answered
        (either would be lost)."""
        info = workflow.info()
        if (self._state.plan is None or self._requests
                or not workflow.all_handlers_finished()):
            return
        if (info.get_current_history_length() < HISTORY_LIMIT
                and not info.is_continue_as_new_suggested()):
            return
        workflow.continue_as_new(InboundEmailInput(
            self.item.event_id, self.item.tenant, carried=self._state))

    # --- people in the loop --------------------------------------------------------------
    async def _recover(self, err: FailureError, op_key: str | None) -> str:
        """Park a failed step for a person. Returns 'retry', 'resolved' or 'send_again'."""
        cause = err.cause if isinstance(err, ActivityError) else err
        error_type = cause.type if isinstance(cause, ApplicationError) else None
        if error_type == ErrorType.AMBIGUOUS.value:
            state, reason = ItemState.AMBIGUOUS, "outcome_unconfirmed"
        elif isinstance(cause, ApplicationError) and error_type == ErrorType.PERMANENT.value:
            state, reason = ItemState.BLOCKED, reason_of(cause)
        else:
            state, reason = ItemState.BLOCKED, "retries_exhausted"
        allowed = set(RECOVERY_ACTIONS) if op_key else RECOVERY_ACTIONS - {"resolve"}
        waiting = Waiting("recovery", reason, allowed, op_key)
        if state == ItemState.AMBIGUOUS and customer_facing(op_key):
            # A retry may reach the customer twice: the policy may ask for a role
            # (docs/architecture.md §6, "Authority"). A run extracted before issue 37 has
            # none, so it replays as it ran.
            waiting.required_role = self._state.repeat_role
            if workflow.patched(SEND_AGAIN_PATCH):
                waiting.allowed.add(SEND_AGAIN)
        if op_key:
            # The ledger's attempts and error label, for the current details.
            view = await self._bookkeeping(ReviewActivities.describe_operation,
                                           OperationInput(self.item, op_key))
            waiting.attempts = f"{view.attempts}/{view.max_attempts}"
            waiting.error = view.last_error
            action = op_key.rsplit(":", 1)[-1]
            self._state.next_attempt[action] = (view.attempts + 1,
                                                view.attempts + self._budget(op_key))
        decision = await self._wait_for_person(waiting, state)
        if decision.action == "resolve":
            assert op_key is not None
            await self._bookkeeping(ReviewActivities.resolve_operation, ResolveInput(
                self.item, op_key, decision.reviewer, decision.evidence or ""))
            return "resolved"
        if decision.action == SEND_AGAIN:
            assert op_key is not None
            await self._send_again(op_key, decision)
            return SEND_AGAIN
        if op_key:
            await self._bookkeeping(ReviewActivities.grant_operation_retry,
                                    RetryGrant(self.item, op_key, decision.reviewer,
                                               self._budget(op_key)))
        return "retry"

    async def _send_again(self, op_key: str, decision: ReviewDecision) -> None:
        """A person's deliberate second send: a new intent of the next generation, with its
        own send (and CRM log) operation, takes the plan's place; the first intent and its
        operations stay as they were."""
        plan = self._state.plan
        assert plan is not None
        generation = self._state.send_generation + 1
        again = await self._bookkeeping(ReviewActivities.send_followup_again, SendAgainInput(
            self.item, op_key, decision.reviewer, decision.note or "", generation,
            self._budget(op_key), logs_sent=bool(plan.sent_op_key)))
        self._state.send_generation = generation
        plan.send_op_key, plan.intent_id = again.send_op_key, again.intent_id
        self._state.operations["send"] = OperationStatus(op_key=again.send_op_key)
        self._state.next_attempt.pop("send", None)
        if again.sent_op_key:
            plan.sent_op_key = again.sent_op_key
            self._state.operations["crm-sent"] = OperationStatus(op_key=again.sent_op_key)

    async def _review(self, reason: str, kind: WaitKind = "review",
                      intent_id: str | None = None,
                      required_role: str | None = None, drafts: bool = False
                      ) -> ReviewDecision:
        """Wait for approve/reject; apply corrected fields. Returns the approval."""
        waiting = Waiting(kind, reason, set(REVIEW_ACTIONS), intent_id=intent_id,
                          needs_sender=kind == "review" and (
                              not self._state.identity_known or reason in NEEDS_SENDER),
                          required_role=required_role,
                          drafts=drafts)
        decision = await self._wait_for_person(waiting, ItemState.AWAITING_REVIEW)
        if decision.corrections:
            refused = await self._bookkeeping(ReviewActivities.apply_review_corrections,
                                              CorrectionInput(self.item, decision.reviewer,
                                                              dict(decision.corrections)))
            if "sender_email" in decision.corrections and "sender_email" not in refused:
                self._state.identity_known = True
        if not decision.send_followup:
            self._state.send_followup = False
        return decision

    async def _wait_for_person(self, waiting: Waiting, state: ItemState) -> ReviewDecision:
        """Open a wait (a new wait ID) and return the first decision that answers it.

        The escalation time is fixed here: holds and refused decisions do not move it."""
        # A task boundary before the wait opens: decisions sent meanwhile (a double click,
        # buffered while local steps ran in one workflow task) arrive now, while no wait is
        # open, and are stale; none can answer a wait nobody has seen yet.
        await workflow.sleep(WAIT_BARRIER)
        self._state.wait_seq += 1
        now = workflow.now()
        escalate_at = now + timedelta(hours=self._state.escalation_hours)
        waiting.seq, waiting.since = self._state.wait_seq, now.isoformat()
        waiting.escalate_at, waiting.card_url = escalate_at.isoformat(), self._state.card_url
        waiting.owner = owner_of(waiting, self._state.owners, self._state.owner)
        self._waiting = waiting
        workflow.set_current_details(details(waiting, state))
        await self._enter(state, waiting.reason, review=True)
        escalated = False
        while True:
            timeout = None if escalated else escalate_at - workflow.now()
            if timeout is not None and timeout <= timedelta(0):
                await self._escalate(waiting.reason)
                escalated = True
                continue
            try:
                await workflow.wait_condition(lambda: bool(self._requests), timeout=timeout)
            except TimeoutError:
                await self._escalate(waiting.reason)
                escalated = True
                continue
            request = self._requests.pop(0)
            decision = await self._take_decision(request, waiting)
            if decision is None:
                continue
            # An update answers once the decision shows in the state (it resumes when this
            # coroutine next waits: after the state below is set).
            request.outcome = "accepted"
            if decision.action == "hold":
                await self._enter(ItemState.HELD, waiting.reason, review=True)
                continue
            self._waiting = None
            if decision.action == "reject":
                raise Rejected()  # run() records `rejected`, which leaves the review
            self._leave_review()
            return decision

    async def _take_decision(self, request: Request, waiting: Waiting
                             ) -> ReviewDecision | None:
        """Check a request against the open wait; record it either way. A request that
        arrived while no wait was open, or for an earlier wait, is stale. Invalid bodies
        never crash."""
        decision, _ = parse_decision(request.action, request.body)
        problem: Refusal | None
        if request.wait_seq != waiting.seq:
            problem = Refusal("stale", "refused: this decision arrived for an earlier wait "
                              f"(or none); the open wait is {waiting.wait_id} "
                              f"({waiting.reason})")
        else:
            problem = refusal(waiting, request.action, request.body, self._status.state,
                              require_wait_id=request.via == "update")
        detail: dict[str, str | int | bool | None] = {
            "accepted": problem is None, "ignored_reason": problem.code if problem else None,
            "note": decision.note if decision else None, "waiting_for": waiting.reason,
            "wait_id": waiting.wait_id, "via": request.via}
        # Who decided comes from authentication (docs/architecture.md §6): the activity
        # verifies the desk's or the CLI's proof over the whole decision, else records the
        # identity Temporal recorded for the request; the typed name stays a label. A proof
        # that does not match, or none in production, refuses the decision: the activity's
        # answer says so (`refused`). No patch: a history recorded before carries answers
        # without `refused`, so it replays down the branch it took (a marker would cost
        # every run an event and a visibility write, "Workflow versions").
        identity = await self._bookkeeping(
            BookkeepingActivities.record_decision, DecisionRecord(
                self.item, request.action, request.via, workflow.info().run_id,
                typed_reviewer=decision.reviewer if decision else "",
                decider=decision.decider if decision else "",
                path=decision.path if decision else "",
                proof=decision.proof if decision else "", wait_id=waiting.wait_id,
                signal_seq=request.signal_seq, update_id=request.update_id,
                detail=detail, note=decision.note if decision else None,
                evidence=decision.evidence if decision else None,
                corrections=dict(decision.corrections) if decision else {},
                send_followup=decision.send_followup if decision else True,
                required_role=(waiting.required_role
                               if request.action in ("retry", SEND_AGAIN)
                               or (request.action == "approve" and waiting.kind == "followup")
                               else None),
                op_key=waiting.op_key if request.action == SEND_AGAIN else None,
                intent_id=waiting.intent_id if decision and decision.draft_sha256 else None,
                draft_sha256=decision.draft_sha256 if decision else None))
        if decision is not None:
            decision.reviewer = identity.decider
        if problem is None and identity.refused:
            problem = Refusal(identity.refused, identity.refusal)
        if problem is not None:
            request.outcome, request.message = problem.code, problem.message
            return None
        return decision

    async def _escalate(self, reason: str) -> None:
        workflow.upsert_search_attributes([SA_OVERDUE.value_set(True)])
        await self._bookkeeping(BookkeepingActivities.mark_review_escalated,
                                EscalationInput(self.item, reason))

    async def _decline_followup(self, plan: PlanResult, reviewer: str) -> None:
        """The reviewer approved the item but not its follow-up: cancel that intent."""
        assert plan.intent_id is not None and plan.send_op_key is not None
        await self._bookkeeping(ReviewActivities.decline_followup_intent, IntentDecline(
            self.item, plan.intent_id, plan.send_op_key, reviewer))
        await self._enter(ItemState.COMPLETED, "followup_declined")

    # --- decisions: signals (the UI's "Send a Signal") and updates ("Send an Update") -----
    def _arrived(self, action: str, body: Any, via: str, update_id: str | None = None
                 ) -> Request:
        request = Request(action, body, self._waiting.seq if self._waiting else None, via,
                          update_id=update_id)
        if via == "signal":
            self._decision_signals += 1
            request.signal_seq = self._decision_signals
        self._requests.append(request)
        return request

    def _validate(self, action: str, body: DecisionBody) -> None:
        """An update validator: refuse before anything reaches history (no I/O, no state)."""
        problem = refusal(self._waiting, action, body, self._status.state,
                          require_wait_id=True)
        if problem is not None:
            # A reason code type: its message stays readable in the UI (platform/codec.py).
            raise ApplicationError(problem.message, type=DECISION_REFUSED, non_retryable=True)

    async def _answer(self, action: str, body: DecisionBody) -> ItemStatus:
        """An accepted update: queued like a signal; answers once the workflow took it."""
        info = workflow.current_update_info()
        request = self._arrived(action, body, "update", info.id if info else None)
        await workflow.wait_condition(lambda: request.outcome is not None)
        if request.outcome != "accepted":
            raise ApplicationError(request.message, type=DECISION_REFUSED, non_retryable=True)
        return self.status()

    @workflow.signal(name=Decision.APPROVE, description=signal_description(Decision.APPROVE))
    def approve(self, body: Any) -> None:
        self._arrived(Decision.APPROVE, body, "signal")

    @workflow.signal(name=Decision.HOLD, description=signal_description(Decision.HOLD))
    def hold(self, body: Any) -> None:
        self._arrived(Decision.HOLD, body, "signal")

    @workflow.signal(name=Decision.REJECT, description=signal_description(Decision.REJECT))
    def reject(self, body: Any) -> None:
        self._arrived(Decision.REJECT, body, "signal")

    @workflow.signal(name=Decision.RETRY, description=signal_description(Decision.RETRY))
    def retry(self, body: Any) -> None:
        self._arrived(Decision.RETRY, body, "signal")

    @workflow.signal(name=Decision.RESOLVE, description=signal_description(Decision.RESOLVE))
    def resolve(self, body: Any) -> None:
        self._arrived(Decision.RESOLVE, body, "signal")

    @workflow.signal(name=Decision.SEND_AGAIN,
                     description=signal_description(Decision.SEND_AGAIN))
    def send_again(self, body: Any) -> None:
        self._arrived(Decision.SEND_AGAIN, body, "signal")

    @workflow.update(name=Decision.APPROVE, description=update_description(Decision.APPROVE))
    async def approve_update(self, body: DecisionBody) -> ItemStatus:
        return await self._answer(Decision.APPROVE, body)

    @approve_update.validator
    def validate_approve(self, body: DecisionBody) -> None:
        self._validate(Decision.APPROVE, body)

    @workflow.update(name=Decision.HOLD, description=update_description(Decision.HOLD))
    async def hold_update(self, body: DecisionBody) -> ItemStatus:
        return await self._answer(Decision.HOLD, body)

    @hold_update.validator
    def validate_hold(self, body: DecisionBody) -> None:
        self._validate(Decision.HOLD, body)

    @workflow.update(name=Decision.REJECT, description=update_description(Decision.REJECT))
    async def reject_update(self, body: DecisionBody) -> ItemStatus:
        return await self._answer(Decision.REJECT, body)

    @reject_update.validator
    def validate_reject(self, body: DecisionBody) -> None:
        self._validate(Decision.REJECT, body)

    @workflow.update(name=Decision.RETRY, description=update_description(Decision.RETRY))
    async def retry_update(self, body: DecisionBody) -> ItemStatus:
        return await self._answer(Decision.RETRY, body)

    @retry_update.validator
    def validate_retry(self, body: DecisionBody) -> None:
        self._validate(Decision.RETRY, body)

    @workflow.update(name=Decision.RESOLVE, description=update_description(Decision.RESOLVE))
    async def resolve_update(self, body: DecisionBody) -> ItemStatus:
        return await self._answer(Decision.RESOLVE, body)

    @resolve_update.validator
    def validate_resolve(self, body: DecisionBody) -> None:
        self._validate(Decision.RESOLVE, body)

    @workflow.update(name=Decision.SEND_AGAIN,
                     description=update_description(Decision.SEND_AGAIN))
    async def send_again_update(self, body: DecisionBody) -> ItemStatus:
        return await self._answer(Decision.SEND_AGAIN, body)

    @send_again_update.validator
    def validate_send_again(self, body: DecisionBody) -> None:
        self._validate(Decision.SEND_AGAIN, body)

    @workflow.signal(name=SIGNAL_WAKE, description=(
        "Sent by `inboxcrm resume`: an item parked on a pause (or waiting for the store) "
        "checks again now. No body."))
    def wake(self) -> None:
        self._woken = True

    @workflow.query(name=QUERY_STATUS, description=(
        "State, reason, operation keys and destination IDs, and the open wait (if any) with "
        "its wait ID, allowed decisions and escalation time."))
    def status(self) -> ItemStatus:
        waiting = self._waiting
        return dataclasses.replace(
            self._status, workflow_id=workflow.info().workflow_id,
            operations=dict(self._state.operations), review=None if waiting is None else OpenReview(
                reason=waiting.reason, owner=waiting.owner or self._state.owner,
                since=waiting.since,
                allowed=sorted(waiting.allowed), op_key=waiting.op_key,
                wait_id=waiting.wait_id, escalate_at=waiting.escalate_at,
                needs_sender=waiting.needs_sender, intent_id=waiting.intent_id,
                error=waiting.error,
                repeat_role=waiting.required_role if waiting.kind != "followup" else None,
                approve_role=waiting.required_role if waiting.kind == "followup" else None))

    # --- state mirroring -----------------------------------------------------------------
    @property
    def item(self) -> ItemRef:
        assert self._item is not None
        return self._item

    def _show(self, state: ItemState, reason: str | None = None,
              extra: list[SearchAttributeUpdate[Any]] | None = None,
              publish: bool = False) -> None:
        """Set the state in the query and, where it may stay for long, in the search
        attributes (no I/O).

        Each upsert is a history event, a visibility write and a billed action, and a happy
        item passes five states in one workflow task, seconds apart. So the search
        attributes get the state at the start, at every wait that may last (a person, a
        pause, the store) and at the end (`publish`); the steps between show in the
        `status` query and in `inbound_events.state`."""
        self._status.state = state.value
        self._status.reason = reason
        updates = list(extra or [])
        if self._shown_state != state.value and publish:
            updates.append(SA_STATE.value_set(state.value))
            self._shown_state = state.value
        if updates:
            workflow.upsert_search_attributes(updates)

    def _publish(self) -> None:
        """Bring the state search attribute up to the current state (a wait begins)."""
        if self._shown_state != self._status.state:
            self._shown_state = self._status.state
            workflow.upsert_search_attributes([SA_STATE.value_set(self._status.state)])

    async def _enter(self, state: ItemState, reason: str | None, review: bool = False) -> None:
        """A state the workflow itself decides: mirrored to PostgreSQL and the UI."""
        updates: list[SearchAttributeUpdate[Any]] = []
        waiting = self._waiting
        owner = (waiting.owner if waiting else "") or self._state.owner
        if state in REVIEW_STATES:
            updates = [SA_NEEDS_REVIEW.value_set(True),
                       SA_REVIEW_REASON.value_set(reason or state.value),
                       SA_REVIEW_OWNER.value_set(owner)]
            self._shown_review = True
        else:
            updates = self._leave_review_updates()
        self._show(state, reason, updates, publish=True)
        await self._bookkeeping(BookkeepingActivities.record_item_state, StateChange(
            self.item, state.value, reason,
            review_reason=reason if review else None,
            review_owner=owner if review else None,
            destination_ref=waiting.op_key if waiting else None,
            escalation_hours=self._state.escalation_hours,
            wait_id=waiting.wait_id if waiting and review else None,
            allowed=sorted(waiting.allowed) if waiting and review else None,
            escalate_at=waiting.escalate_at if waiting and review else None,
            needs_sender=bool(waiting and waiting.needs_sender)))

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

    async def _activity(self, fn: Step[Owner, Arg, Result], arg: Arg, timeout: timedelta,
                        retry: RetryPolicy, summary: str | None = None,
                        task_queue: str | None = None) -> Result:
        """Run a step in the worker that runs this workflow (a local activity).

        Safe because no step relies on running once: every side effect goes through the
        operation ledger (claim, reconcile-before-retry, record-before-success) and the other
        steps are idempotent transactions. What it saves is a server round trip and a
        workflow task per step. A worker killed mid-step is noticed after the workflow task
        timeout (10 s) and another worker re-runs the step from the ledger's state. A step
        given a `task_queue` (the model call) is always a regular activity there, with
        heartbeats: a dead worker is noticed after HEARTBEAT_TIMEOUT."""
        if task_queue is not None:
            return await workflow.execute_activity_method(
                fn, arg, task_queue=task_queue, start_to_close_timeout=timeout,
                retry_policy=retry, heartbeat_timeout=HEARTBEAT_TIMEOUT, summary=summary)
        return await workflow.execute_local_activity_method(
            fn, arg, start_to_close_timeout=timeout, retry_policy=retry, summary=summary)

    async def _bookkeeping(self, fn: Step[Owner, Arg, Result], arg: Arg) -> Result:
        """State mirror, audit, review tasks. Past a few quick attempts against an
        unreachable store the item waits for the store (capped backoff) for as long as it
        takes. Any other failure is a bug no wait can fix: the run fails, and shows as
        `failed` in the queue (docs/architecture.md §3)."""
        while True:
            try:
                result = await workflow.execute_local_activity_method(
                    fn, arg, start_to_close_timeout=BOOKKEEPING_TIMEOUT,
                    retry_policy=BOOKKEEPING_RETRY)
            except STEP_FAILURES as err:
                if not is_store_outage(err):
                    raise
                await self._wait_for_store()
                continue
            self._store_wait = STORE_WAIT_FIRST  # the store answers again
            return result


def _end_without_followup(plan: PlanResult) -> ItemEnd:
    """Where an item with no follow-up to send ends."""
    if plan.reason == "suppressed":
        return ItemEnd(ItemState.SUPPRESSED.value, plan.reason)
    return ItemEnd(ItemState.COMPLETED.value, plan.reason or "no_followup")


def _jittered(wait: timedelta) -> timedelta:
    """A backoff wait shortened by up to WAIT_JITTER of itself (never lengthened, so the
    documented maxima hold), so items that started waiting together (a store outage, a
    pause) do not all come back in the same second. `workflow.random()` is seeded by the run,
    so a replay draws the same numbers; only the timers' durations change, not the commands."""
    return wait * (1 - WAIT_JITTER * workflow.random().random())


def _park_wait(fallback: timedelta, retry_at: str | None) -> timedelta:
    """How long a parked operation waits before it checks again: its jittered fallback, or
    less when a destination's limit says when it ends (`retry_at`). The end of such a limit
    is never anticipated: a little is added (up to PARK_END_SPREAD), so the items a tenant
    parked together do not all call the provider in the same second."""
    wait = _jittered(fallback)
    if retry_at is None:
        return wait
    remaining = datetime.fromisoformat(retry_at) - workflow.now()
    spread = min(remaining * WAIT_JITTER, PARK_END_SPREAD) * workflow.random().random()
    return min(wait, max(remaining, timedelta(0)) + max(spread, timedelta(0)) + PARK_END_MIN)


