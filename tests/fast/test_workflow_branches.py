"""The workflow's branches in the SDK's time-skipping environment, no stack: every activity
is replaced by a function registered under the activity's real name, so the workflow code
under test is exactly the production class. Hours of review waits pass in milliseconds.

What these prove is the orchestration (which step runs, which state the item ends in, what
a person's decision does); what the steps do to PostgreSQL and the destinations is the
stack tier's job."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from inboxcrm.activities.store_outage import StoreOutageInterceptor
from inboxcrm.platform.temporal import SEARCH_ATTRIBUTES as SEARCH_ATTRIBUTE_TYPES
from inboxcrm.schemas.contract import (
    QUERY_STATUS,
    SA_NEEDS_REVIEW,
    SA_STATE,
    SA_TENANT,
    SEARCH_ATTRIBUTES,
    Decision,
    start_search_attributes,
)
from inboxcrm.schemas.models import (
    AuditEntry,
    CorrectionInput,
    DecisionBody,
    DecisionIdentity,
    DecisionRecord,
    EscalationInput,
    ExtractResult,
    InboundEmailInput,
    IntentApproval,
    IntentDecline,
    ItemEnd,
    ItemRef,
    ItemStatus,
    OperationInput,
    OperationResult,
    OperationView,
    PlanInput,
    PlanResult,
    ResolveInput,
    RetryGrant,
    ShadowPlanResult,
    StateChange,
    StepRetry,
)
from inboxcrm.schemas.outcomes import ErrorType
from inboxcrm.workflows import step_options
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow

TEST_SERVER = Path(sys.executable).with_name("temporal-test-server")


@dataclass
class Scenario:
    """What the replaced activities answer, and what they were asked."""

    route: str = "auto"
    reasons: list[str] = field(default_factory=list)
    shadow: bool = False
    plan: PlanResult = field(default_factory=lambda: planned())
    crm_failures: list[ApplicationError] = field(default_factory=list)
    plan_failures: list[ApplicationError] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    states: list[str] = field(default_factory=list)
    audit: list[str] = field(default_factory=list)
    decisions: list[DecisionRecord] = field(default_factory=list)
    approvals: list[str] = field(default_factory=list)
    state_failures: list[BaseException] = field(default_factory=list)
    state_calls: int = 0
    # The CRM answers `parked` until this moment of the test server's clock (`clock`).
    crm_parked_until: datetime | None = None
    clock: Callable[[], Awaitable[datetime]] | None = None
    crm_checks: list[datetime] = field(default_factory=list)
    # The LLM extractor: the model call runs on this queue (set by `run`), as a regular
    # activity; each call's (task queue, local?) is recorded.
    model_queue: str | None = None
    model_calls: list[tuple[str, bool]] = field(default_factory=list)
    # The last step's success also recorded the item's end it was given (as the real steps
    # do; False: as a step found already completed answers), and what each step was given.
    last_step_records_end: bool = False
    ends: dict[str, ItemEnd | None] = field(default_factory=dict)
    # The attempt budget each reviewer's retry granted.
    budgets: list[int] = field(default_factory=list)

    def completed(self, op: OperationInput, action: str, destination_id: str
                  ) -> OperationResult:
        self.ends[action] = op.ends_item
        return OperationResult(status="completed", destination_id=destination_id,
                               end_recorded=self.last_step_records_end
                               and op.ends_item is not None)

    def activities(self) -> list[Callable[..., Any]]:
        @activity.defn(name="extract_message")
        async def extract_message(item: ItemRef) -> ExtractResult:
            self.calls["extract"] += 1
            if self.model_queue is not None and not self.model_calls:
                return ExtractResult(route="review", escalation_hours=1.0,
                                     model_queue=self.model_queue)
            return ExtractResult(route=self.route, reasons=list(self.reasons),
                                 escalation_hours=1.0, shadow=self.shadow)

        @activity.defn(name="match_and_plan")
        async def match_and_plan(plan: PlanInput) -> PlanResult:
            self.calls["plan"] += 1
            if self.plan_failures:
                raise self.plan_failures.pop(0)
            return self.plan

        @activity.defn(name="upsert_contact_in_crm")
        async def upsert_contact_in_crm(op: OperationInput) -> OperationResult:
            self.calls["crm-upsert"] += 1
            if self.crm_parked_until is not None and self.clock is not None:
                now = await self.clock()
                self.crm_checks.append(now)
                if now < self.crm_parked_until:
                    return OperationResult(status="parked", reason="paused",
                                           retry_at=self.crm_parked_until.isoformat())
            if self.crm_failures:
                raise self.crm_failures.pop(0)
            return self.completed(op, "crm-upsert", "crm-1")

        @activity.defn(name="log_email_on_contact")
        async def log_email_on_contact(op: OperationInput) -> OperationResult:
            self.calls["crm-note"] += 1
            return self.completed(op, "crm-note", "note-1")

        @activity.defn(name="submit_followup_email")
        async def submit_followup_email(op: OperationInput) -> OperationResult:
            self.calls["send"] += 1
            return self.completed(op, "send", "msg-1")

        @activity.defn(name="record_item_state")
        async def record_item_state(change: StateChange) -> None:
            self.state_calls += 1
            if self.state_failures:
                raise self.state_failures.pop(0)
            self.states.append(change.state)

        @activity.defn(name="record_audit")
        async def record_audit(entry: AuditEntry) -> None:
            self.audit.append(f"{entry.action}:{entry.detail.get('accepted')}")

        @activity.defn(name="record_decision")
        async def record_decision(record: DecisionRecord) -> DecisionIdentity:
            # The real one verifies the proof (tests/fast/test_reviewer_identity.py); here a
            # claimed decider stands for a verified one, anything else for Temporal's.
            self.decisions.append(record)
            self.audit.append(f"{record.via}_{record.action}:{record.detail.get('accepted')}")
            if record.proof == "tampered":  # what the real one answers to a mismatch
                return DecisionIdentity("temporal:no identity", f"temporal-ui {record.via}",
                                        refused="proof_invalid",
                                        refusal="refused (proof_invalid): decide again at "
                                                "the review desk")
            if record.proof:
                return DecisionIdentity(record.decider, record.path, authenticated=True)
            return DecisionIdentity("temporal:no identity", f"temporal-ui {record.via}")

        @activity.defn(name="mark_review_escalated")
        async def mark_review_escalated(escalation: EscalationInput) -> None:
            self.calls["escalated"] += 1

        @activity.defn(name="resolve_operation")
        async def resolve_operation(resolve: ResolveInput) -> None:
            self.calls["resolved"] += 1

        @activity.defn(name="grant_operation_retry")
        async def grant_operation_retry(grant: RetryGrant) -> None:
            self.calls["retry_granted"] += 1
            self.budgets.append(grant.budget)

        @activity.defn(name="apply_review_corrections")
        async def apply_review_corrections(correction: CorrectionInput) -> list[str]:
            self.calls["corrected"] += 1
            return []

        @activity.defn(name="approve_followup_intent")
        async def approve_followup_intent(approval: IntentApproval) -> None:
            self.calls["intent_approved"] += 1
            self.approvals.append(approval.reviewer)

        @activity.defn(name="decline_followup_intent")
        async def decline_followup_intent(decline: IntentDecline) -> None:
            self.calls["intent_declined"] += 1

        @activity.defn(name="plan_in_shadow")
        async def plan_in_shadow(item: ItemRef) -> ShadowPlanResult:
            self.calls["shadow-plan"] += 1
            return ShadowPlanResult(outcome="would_review")

        @activity.defn(name="describe_operation")
        async def describe_operation(op: OperationInput) -> OperationView:
            return OperationView(attempts=self.calls[op.op_key.rsplit(":", 1)[-1]],
                                 max_attempts=6, last_error="http_400:INVALID_EMAIL")

        return [extract_message, match_and_plan, upsert_contact_in_crm, log_email_on_contact,
                submit_followup_email, record_item_state, record_audit, record_decision,
                mark_review_escalated, resolve_operation, grant_operation_retry,
                apply_review_corrections, approve_followup_intent, decline_followup_intent,
                describe_operation, plan_in_shadow]


    def extract_with_model(self) -> Callable[..., Any]:
        @activity.defn(name="extract_with_model")
        async def extract_with_model(item: ItemRef) -> ExtractResult:
            info = activity.info()
            self.model_calls.append((info.task_queue, info.is_local))
            return ExtractResult(route=self.route, reasons=list(self.reasons),
                                 escalation_hours=1.0)

        return extract_with_model


def planned(**overrides: Any) -> PlanResult:
    values: dict[str, Any] = dict(
        outcome="planned", contact_id="c-1", crm_op_key="wf:crm-upsert",
        note_op_key="wf:crm-note", send_op_key="wf:send", intent_id="i-1")
    values.update(overrides)
    return PlanResult(**values)


def permanent(reason: str) -> ApplicationError:
    return ApplicationError(f"permanent: {reason}", type=ErrorType.PERMANENT.value,
                            non_retryable=True)


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    environment = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(TEST_SERVER))
    # The workflow upserts the contract's search attributes: the test server must know them
    # (it has no ListSearchAttributes, so the stack's `ensure_search_attributes` cannot run).
    await environment.client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=environment.client.namespace, search_attributes=SEARCH_ATTRIBUTE_TYPES))
    try:
        yield environment
    finally:
        await environment.shutdown()


async def run(env: WorkflowEnvironment, scenario: Scenario,
              drive: Callable[[WorkflowHandle[Any, Any]], Any] | None = None,
              summaries: list[str] | None = None,
              started: list[WorkflowHandle[Any, Any]] | None = None,
              search_attributes: TypedSearchAttributes | None = None,
              params: Any = None) -> dict[str, Any]:
    """Start one item on a worker of its own task queue, let `drive` act as a person, and
    return the workflow's result as the JSON a client sees (`summaries`: filled with the
    steps' summaries from the history; `started`: gets the handle; `search_attributes`: the
    start's, as the relay sets them; `params`: the input, if not a new item's)."""
    queue = f"branches-{uuid.uuid4().hex[:8]}"
    client: Client = env.client
    if scenario.model_queue is not None:
        scenario.model_queue = f"{queue}-model"
    models = Worker(client, task_queue=f"{queue}-model",
                    activities=[scenario.extract_with_model()])
    async with Worker(client, task_queue=queue, workflows=[InboundEmailWorkflow],
                      activities=scenario.activities(),
                      interceptors=[StoreOutageInterceptor()]), models:
        handle = await client.start_workflow(
            InboundEmailWorkflow.run,
            params or InboundEmailInput(event_id="e-1", tenant="acme"),
            id=f"inbound/acme/test/{uuid.uuid4().hex}", task_queue=queue,
            search_attributes=search_attributes)
        if started is not None:
            started.append(handle)
        if drive is not None:
            await drive(handle)
        result = await handle.result()
        if summaries is not None:
            async for event in handle.fetch_history_events():
                if event.HasField("user_metadata") and event.user_metadata.HasField("summary"):
                    summaries.append(json.loads(event.user_metadata.summary.data))
    assert isinstance(result, ItemStatus)
    return {"state": result.state, "reason": result.reason,
            "operations": {k: v.status for k, v in result.operations.items()}}


async def wait_for_state(handle: WorkflowHandle[Any, Any], state: str) -> dict[str, Any]:
    for _ in range(200):
        status: dict[str, Any] = await handle.query(QUERY_STATUS)
        if status["state"] == state and status["review"] is not None:
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"never reached {state}: {status}")


async def decide(handle: WorkflowHandle[Any, Any], decision: Decision,
                 body: dict[str, Any] | None = None) -> None:
    await handle.signal(decision, {"reviewer": "rita", **(body or {})})


async def test_auto_item_runs_every_step_once(env: WorkflowEnvironment) -> None:
    scenario = Scenario()
    result = await run(env, scenario)
    assert result["state"] == "completed" and result["reason"] == "followup_sent"
    assert result["operations"] == {"crm-upsert": "completed", "crm-note": "completed",
                                    "send": "completed"}
    assert +scenario.calls == Counter(extract=1, plan=1, **{"crm-upsert": 1, "crm-note": 1},
                                      send=1)
    assert scenario.states == ["completed"]


async def own_upserts(handle: WorkflowHandle[Any, Any]) -> list[set[str]]:
    """The search attributes each of the run's own upserts set (the patches'
    `TemporalChangeVersion` upserts left out)."""
    upserts = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            names = set(event.upsert_workflow_search_attributes_event_attributes
                        .search_attributes.indexed_fields) - {"TemporalChangeVersion"}
            if names:
                upserts.append(names)
    return upserts


@pytest.mark.parametrize("from_start", [True, False], ids=["relay", "older-relay"])
async def test_a_happy_item_started_with_its_search_attributes_upserts_only_its_end(
        env: WorkflowEnvironment, from_start: bool) -> None:
    """The relay starts an item with its tenant and first state; the run then upserts only
    its final state. A run started without them (an older relay) upserts them itself, so
    both end with the same search attributes."""
    started: list[WorkflowHandle[Any, Any]] = []
    result = await run(env, Scenario(), started=started,
                       search_attributes=start_search_attributes("acme") if from_start else None)
    assert result["state"] == "completed"
    upserts = await own_upserts(started[0])
    at_end = {SA_STATE.name}
    assert upserts == ([at_end] if from_start else [{SA_TENANT.name, SA_STATE.name}, at_end])
    shown = (await started[0].describe()).typed_search_attributes
    assert (shown.get(SA_TENANT), shown.get(SA_STATE)) == ("acme", "completed")


async def run_approved(env: WorkflowEnvironment, scenario: Scenario
                       ) -> tuple[dict[str, Any], WorkflowHandle[Any, Any]]:
    """Run an item that waits for review; a person approves it at once."""
    started: list[WorkflowHandle[Any, Any]] = []

    async def approve(handle: WorkflowHandle[Any, Any]) -> None:
        await wait_for_state(handle, "awaiting_review")
        await decide(handle, Decision.APPROVE)

    result = await run(env, scenario, approve, started=started)
    return result, started[0]


async def patch_markers(handle: WorkflowHandle[Any, Any]) -> tuple[list[str], int]:
    """The patch IDs the run recorded, in order, and how many `TemporalChangeVersion`
    upserts came with them."""
    ids: list[str] = []
    versions = 0
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_patch":
                ids.append(json.loads(marker.details["patch-data"].payloads[0].data)["id"])
        elif event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = event.upsert_workflow_search_attributes_event_attributes \
                .search_attributes.indexed_fields
            versions += "TemporalChangeVersion" in fields
    return ids, versions


async def test_a_new_run_records_one_marker_for_every_patch_of_the_release(
        env: WorkflowEnvironment) -> None:
    """A run takes the new branch of every patch folded into `patches-of-0.2` with that one
    marker: through a person's review, a CRM note and a send it records no other (each
    would be a marker and a `TemporalChangeVersion` upsert)."""
    scenario = Scenario(route="review", reasons=["prompt_injection"])
    result, handle = await run_approved(env, scenario)
    assert (result["state"], result["reason"]) == ("completed", "followup_sent")
    assert result["operations"]["crm-note"] == "completed"
    assert scenario.decisions and scenario.decisions[0].decider is not None
    assert await patch_markers(handle) == (["patches-of-0.2"], 1)


async def test_a_send_that_recorded_the_items_end_is_not_followed_by_a_state_step(
        env: WorkflowEnvironment) -> None:
    """The send is given the item's end (`completed / followup_sent`) and its success
    recorded it: the run records no state of its own after it, and still clears the review
    marks a person's review left (the item ends completed in its result and its search
    attributes). The CRM steps before it end nothing."""
    scenario = Scenario(route="review", reasons=["prompt_injection"], last_step_records_end=True)
    result, handle = await run_approved(env, scenario)
    assert (result["state"], result["reason"]) == ("completed", "followup_sent")
    assert scenario.ends == {"crm-upsert": None, "crm-note": None,
                             "send": ItemEnd("completed", "followup_sent")}
    assert scenario.states == ["awaiting_review"]  # the review, recorded; the end, by the send
    shown = (await handle.describe()).typed_search_attributes
    assert (shown.get(SA_STATE), shown.get(SA_NEEDS_REVIEW)) == ("completed", False)


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "found-completed"])
@pytest.mark.parametrize(("reason", "state"), [("quiet_period", "completed"),
                                               ("suppressed", "suppressed")])
async def test_without_a_follow_up_the_crm_note_carries_the_items_end(
        env: WorkflowEnvironment, reason: str, state: str, recorded: bool) -> None:
    """No follow-up planned: the CRM note is the last step and is given the end the plan
    implies. Recorded by it, the run records nothing after it; found already completed, the
    run records the end itself."""
    scenario = Scenario(plan=planned(send_op_key=None, intent_id=None, reason=reason),
                        last_step_records_end=recorded)
    result = await run(env, scenario)
    assert (result["state"], result["reason"]) == (state, reason)
    assert scenario.ends == {"crm-upsert": None, "crm-note": ItemEnd(state, reason)}
    assert scenario.calls["send"] == 0
    assert scenario.states == ([] if recorded else [state])


async def test_ignored_item_writes_and_sends_nothing(env: WorkflowEnvironment) -> None:
    scenario = Scenario(route="ignore", reasons=["auto_reply"])
    result = await run(env, scenario)
    assert (result["state"], result["reason"]) == ("ignored", "auto_reply")
    assert set(scenario.calls) == {"extract"}


@pytest.mark.parametrize("route", ["auto", "review", "ignore", "opt_out"])
async def test_a_shadowed_item_is_planned_and_nothing_else(
        env: WorkflowEnvironment, route: str) -> None:
    """A tenant in shadow mode: whatever the route, no planner, no destination, no person;
    the item ends `shadowed` with the shadow plan's outcome."""
    scenario = Scenario(route=route, reasons=["prompt_injection"], shadow=True)
    result = await run(env, scenario)
    assert (result["state"], result["reason"]) == ("shadowed", "would_review")
    assert +scenario.calls == Counter(extract=1, **{"shadow-plan": 1})
    assert scenario.states == ["shadowed"] and result["operations"] == {}


async def test_a_follow_up_held_by_the_ramp_waits_with_its_reason(
        env: WorkflowEnvironment) -> None:
    """The hour's automatic follow-ups are used up: the item waits for a reviewer with the
    reason `ramp_limit` (queue, UI), and the approval sends it."""
    scenario = Scenario(plan=planned(intent_needs_approval=True, approval_reason="ramp_limit"))

    async def approve(handle: WorkflowHandle[Any, Any]) -> None:
        status = await wait_for_state(handle, "awaiting_review")
        assert status["review"]["reason"] == "ramp_limit"
        assert status["review"]["intent_id"] == "i-1"
        assert scenario.calls["send"] == 0 and scenario.calls["crm-upsert"] == 1
        await decide(handle, Decision.APPROVE)

    result = await run(env, scenario, approve)
    assert (result["state"], result["reason"]) == ("completed", "followup_sent")
    assert scenario.calls["intent_approved"] == 1 and scenario.calls["send"] == 1


async def test_review_item_waits_for_approval_then_continues(env: WorkflowEnvironment) -> None:
    scenario = Scenario(route="review", reasons=["prompt_injection"])

    async def approve(handle: WorkflowHandle[Any, Any]) -> None:
        status = await wait_for_state(handle, "awaiting_review")
        assert status["review"]["reason"] == "prompt_injection"
        assert scenario.calls["plan"] == 0  # nothing is written before a person decides
        await decide(handle, Decision.APPROVE)

    result = await run(env, scenario, approve)
    assert result["state"] == "completed"
    assert scenario.states[0] == "awaiting_review"
    assert "signal_approve:True" in scenario.audit


async def test_rejected_item_ends_rejected_without_side_effects(
        env: WorkflowEnvironment) -> None:
    scenario = Scenario(route="review", reasons=["legal_threat"])

    async def reject(handle: WorkflowHandle[Any, Any]) -> None:
        await wait_for_state(handle, "awaiting_review")
        await decide(handle, Decision.REJECT)

    result = await run(env, scenario, reject)
    assert result["state"] == "rejected"
    assert not {"plan", "crm-upsert", "send"} & set(scenario.calls)


async def test_a_decision_without_a_reviewer_is_recorded_and_ignored(
        env: WorkflowEnvironment) -> None:
    scenario = Scenario(route="review", reasons=["prompt_injection"])

    async def approve_badly_then_well(handle: WorkflowHandle[Any, Any]) -> None:
        await wait_for_state(handle, "awaiting_review")
        await handle.signal(Decision.APPROVE, {})
        await decide(handle, Decision.APPROVE)

    result = await run(env, scenario, approve_badly_then_well)
    assert result["state"] == "completed"
    assert scenario.audit[:2] == ["signal_approve:False", "signal_approve:True"]


async def test_permanent_crm_error_blocks_until_a_person_retries(
        env: WorkflowEnvironment) -> None:
    scenario = Scenario(crm_failures=[permanent("http_400:INVALID_EMAIL")])
    summaries: list[str] = []

    async def retry(handle: WorkflowHandle[Any, Any]) -> None:
        status = await wait_for_state(handle, "blocked")
        assert status["reason"] == "http_400:INVALID_EMAIL"
        assert status["review"]["op_key"] == "wf:crm-upsert"
        await decide(handle, Decision.RETRY)

    result = await run(env, scenario, retry, summaries=summaries)
    assert result["state"] == "completed"
    assert scenario.calls["crm-upsert"] == 2 and scenario.calls["retry_granted"] == 1
    # Each step's summary in the history says which ledger attempt it is, of what budget.
    assert [s for s in summaries if s.startswith("crm-upsert")] == [
        "crm-upsert attempt 1/6", "crm-upsert attempt 2/7"]
    assert {"extract", "match-and-plan", "send attempt 1/6"} <= set(summaries)


async def test_the_plans_retry_settings_are_the_crm_steps_retries_and_budget(
        env: WorkflowEnvironment) -> None:
    """A tenant's `retries` reach the workflow in the plan: two attempts of the CRM call, then
    a person; their retry grants two more; the send keeps its own settings."""
    transient = [ApplicationError("rate limited", type=ErrorType.TRANSIENT.value)
                 for _ in range(3)]
    scenario = Scenario(crm_failures=transient, plan=planned(
        crm_retry=StepRetry(max_attempts=2, initial_seconds=0.5, maximum_seconds=1.0),
        send_retry=StepRetry(max_attempts=3, initial_seconds=0.5, maximum_seconds=1.0)))
    summaries: list[str] = []

    async def retry(handle: WorkflowHandle[Any, Any]) -> None:
        await wait_for_state(handle, "blocked")
        assert scenario.calls["crm-upsert"] == 2
        await decide(handle, Decision.RETRY)

    result = await run(env, scenario, retry, summaries=summaries)
    assert result["state"] == "completed"
    assert scenario.calls["crm-upsert"] == 4 and scenario.budgets == [2]
    assert [s for s in summaries if s.startswith("crm-upsert")] == [
        "crm-upsert attempt 1/2", "crm-upsert attempt 3/4"]
    assert "send attempt 1/3" in summaries


async def test_a_step_refused_by_a_draining_worker_runs_again_without_a_person(
        env: WorkflowEnvironment) -> None:
    """A worker shutting down refuses to start planning (inboxcrm/activities/step_attempts.py): the
    workflow waits one short timer, so the draining worker can finish its task and exit, and
    the step runs again; no review, no failure."""
    draining = ApplicationError("worker draining", type=ErrorType.WORKER_DRAINING.value,
                                non_retryable=True)
    scenario = Scenario(plan_failures=[draining])

    # (Sent to a person instead, the item would wait for a decision that never comes.)
    result = await asyncio.wait_for(run(env, scenario), timeout=30)
    assert (result["state"], result["reason"]) == ("completed", "followup_sent")
    assert scenario.calls["plan"] == 2 and scenario.calls["crm-upsert"] == 1
    assert scenario.states == ["completed"]


async def test_ambiguous_side_effect_resolved_with_evidence_is_not_repeated(
        env: WorkflowEnvironment) -> None:
    scenario = Scenario(crm_failures=[ApplicationError(
        "unknown: read_timeout", type=ErrorType.AMBIGUOUS.value, non_retryable=True)])

    async def resolve(handle: WorkflowHandle[Any, Any]) -> None:
        await wait_for_state(handle, "ambiguous")
        await decide(handle, Decision.RESOLVE)  # refused: no evidence
        await decide(handle, Decision.RESOLVE, {"evidence": "crm record 42"})

    result = await run(env, scenario, resolve)
    assert result["state"] == "completed"
    assert result["operations"]["crm-upsert"] == "completed"
    assert scenario.calls["crm-upsert"] == 1 and scenario.calls["resolved"] == 1
    assert "signal_resolve:False" in scenario.audit


async def test_an_unanswered_review_escalates_after_the_tenant_deadline(
        env: WorkflowEnvironment) -> None:
    scenario = Scenario(route="review", reasons=["several_identities"])

    async def wait_past_deadline(handle: WorkflowHandle[Any, Any]) -> None:
        await wait_for_state(handle, "awaiting_review")
        await env.sleep(timedelta(hours=2))  # the scenario's tenant escalates after 1 h
        for _ in range(100):
            if scenario.calls["escalated"]:
                break
            await asyncio.sleep(0.05)
        assert scenario.calls["escalated"] == 1
        await decide(handle, Decision.REJECT)

    result = await run(env, scenario, wait_past_deadline)
    assert result["state"] == "rejected"


async def test_opt_out_plan_ends_suppressed_without_crm_or_mail(
        env: WorkflowEnvironment) -> None:
    scenario = Scenario(route="opt_out", plan=PlanResult(outcome="opted_out",
                                                         reason="opt_out_recorded"))
    result = await run(env, scenario)
    assert (result["state"], result["reason"]) == ("suppressed", "opt_out_recorded")
    assert not {"crm-upsert", "send"} & set(scenario.calls)


def test_every_contract_search_attribute_is_used_by_the_workflow() -> None:
    source = Path(sys.modules[InboundEmailWorkflow.__module__].__file__ or "").read_text()
    names = {"SA_STATE", "SA_REVIEW_REASON", "SA_REVIEW_OWNER", "SA_TENANT",
             "SA_NEEDS_REVIEW", "SA_OVERDUE"}
    assert len(SEARCH_ATTRIBUTES) == len(names)
    assert all(name in source for name in names)


async def test_updates_refuse_what_the_open_wait_cannot_take_and_answer_the_rest(
        env: WorkflowEnvironment) -> None:
    """A refused update never reaches history; an accepted one answers with the new status."""
    scenario = Scenario(route="review", reasons=["missing_sender"])

    async def decide_by_update(handle: WorkflowHandle[Any, Any]) -> None:
        status = await wait_for_state(handle, "awaiting_review")
        wait_id = status["review"]["wait_id"]
        refusals = {
            "reviewer_required": DecisionBody(wait_id=wait_id),
            "is not the open one": DecisionBody(reviewer="rita", wait_id="w999-review"),
            "needs corrections.sender_email": DecisionBody(reviewer="rita", wait_id=wait_id),
        }
        for expected, body in refusals.items():
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(Decision.APPROVE, body)
            assert expected in str(refused.value.cause), (expected, refused.value.cause)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(Decision.RETRY,
                                        DecisionBody(reviewer="rita", wait_id=wait_id))
        assert "allowed: approve, hold, reject" in str(refused.value.cause)
        answer = await handle.execute_update(
            Decision.APPROVE, DecisionBody(reviewer="rita", wait_id=wait_id,
                                           corrections={"sender_email": "jane@example.com"}),
            result_type=ItemStatus)
        assert answer.state != "awaiting_review" or answer.review is None

    result = await run(env, scenario, decide_by_update)
    assert result["state"] == "completed"
    assert scenario.calls["corrected"] == 1


async def test_the_decider_comes_from_authentication_not_the_typed_name(
        env: WorkflowEnvironment) -> None:
    """An update carrying the desk's decider and proof is recorded (and approves the
    follow-up) as that decider; a signal without one as Temporal's identity, with its ordinal
    in the run so the activity can find the request's identity in history."""
    scenario = Scenario(plan=planned(intent_needs_approval=True))

    async def approve(handle: WorkflowHandle[Any, Any]) -> None:
        status = await wait_for_state(handle, "awaiting_review")
        await decide(handle, Decision.HOLD, {"reviewer": "typed-anything"})
        await wait_for_state(handle, "held")
        await handle.execute_update(Decision.APPROVE, DecisionBody(
            reviewer="mallory", wait_id=status["review"]["wait_id"], decider="reviewer:dana",
            path="desk", proof="p"), result_type=ItemStatus)

    result = await run(env, scenario, approve)
    assert result["state"] == "completed"
    held, approved = scenario.decisions
    assert (held.via, held.signal_seq, held.typed_reviewer, held.proof) == (
        "signal", 1, "typed-anything", "")
    assert (approved.via, approved.decider, approved.path, approved.typed_reviewer) == (
        "update", "reviewer:dana", "desk", "mallory")
    assert approved.update_id and approved.signal_seq is None
    assert scenario.approvals == ["reviewer:dana"]  # never the typed "mallory"


async def test_a_decision_the_activity_refuses_for_its_proof_is_refused(
        env: WorkflowEnvironment) -> None:
    """The bookkeeping activity's word on the proof decides (issue 36): a decision whose
    proof does not match its body is refused with the activity's reason, the wait stays
    open, and nothing it carried is applied; the proven one after it is taken."""
    scenario = Scenario(route="review", reasons=["missing_sender"])

    async def decide_by_update(handle: WorkflowHandle[Any, Any]) -> None:
        status = await wait_for_state(handle, "awaiting_review")
        wait_id = status["review"]["wait_id"]
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(Decision.APPROVE, DecisionBody(
                reviewer="rita", wait_id=wait_id, decider="reviewer:rita", path="desk",
                corrections={"sender_email": "evil@example.com"}, proof="tampered"))
        assert "proof_invalid" in str(refused.value.cause)
        assert (await wait_for_state(handle, "awaiting_review"))["review"]["wait_id"] == (
            wait_id)
        await handle.execute_update(Decision.APPROVE, DecisionBody(
            reviewer="rita", wait_id=wait_id, decider="reviewer:rita", path="desk",
            corrections={"sender_email": "jane@example.com"}, proof="p"),
            result_type=ItemStatus)

    result = await run(env, scenario, decide_by_update)
    assert result["state"] == "completed"
    assert scenario.calls["corrected"] == 1
    assert [d.proof for d in scenario.decisions] == ["tampered", "p"]
    assert scenario.decisions[0].corrections == {"sender_email": "evil@example.com"}


async def test_bookkeeping_retries_a_store_error_and_completes(
        env: WorkflowEnvironment) -> None:
    """A refused connection is a store error: retried (and, past the budget, waited out)."""
    scenario = Scenario(state_failures=[ConnectionRefusedError(111, "Connect call failed")])
    result = await asyncio.wait_for(run(env, scenario), timeout=30)
    assert (result["state"], result["reason"]) == ("completed", "followup_sent")
    assert scenario.state_calls == 2 and scenario.states == ["completed"]


@pytest.mark.parametrize("bug", [FileNotFoundError(2, "No such file"), KeyError("route"),
                                 ValueError("bad")])
async def test_a_bug_in_bookkeeping_fails_the_run_instead_of_waiting_for_the_store(
        env: WorkflowEnvironment, bug: BaseException) -> None:
    """Not a store error: not retried, never `store_unavailable`; the run fails, which the
    relay's sweeper shows as `failed` in the queue (tested on the stack)."""
    scenario = Scenario(state_failures=[bug])
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(run(env, scenario), timeout=30)
    cause = failed.value.cause
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.cause
    assert isinstance(cause, ApplicationError)
    assert (cause.type, cause.message) == (ErrorType.STEP_BUG.value,
                                           f"bug: {type(bug).__name__}")
    assert scenario.state_calls == 1  # not retried


async def test_a_destination_park_ends_when_the_destination_said(
        env: WorkflowEnvironment) -> None:
    """Parked by a Retry-After of an hour (`retry_at`), the operation checks again when the
    hour is over (plus at most a minute's spread), not on its backing-off fallback (which
    alone would first look again after about 85 minutes), and never before."""
    start = await env.get_current_time()
    scenario = Scenario(crm_parked_until=start + timedelta(hours=1),
                        clock=env.get_current_time)
    result = await run(env, scenario)
    assert (result["state"], result["reason"]) == ("completed", "followup_sent")
    *waiting, done = scenario.crm_checks
    assert all(check < start + timedelta(hours=1) for check in waiting)
    assert timedelta(hours=1) <= done - start <= timedelta(hours=1, seconds=75), done - start
    assert len(waiting) <= 12  # the fallback backs off: 5 s, 10 s, … (each up to 20 % less)


async def test_the_model_call_runs_as_a_regular_activity_on_its_own_queue(
        env: WorkflowEnvironment) -> None:
    """With the LLM extractor the local step names the model's task queue; the workflow runs
    `extract_with_model` there, once, as a regular activity, then goes on as usual."""
    scenario = Scenario(model_queue="")
    summaries: list[str] = []
    result = await run(env, scenario, summaries=summaries)
    assert (result["state"], result["reason"]) == ("completed", "followup_sent")
    assert scenario.model_calls == [(scenario.model_queue, False)]
    assert scenario.calls["extract"] == 1 and scenario.calls["plan"] == 1
    assert summaries[:2] == ["extract", "extract with model"]


async def test_with_the_rules_extractor_nothing_runs_on_the_model_queue(
        env: WorkflowEnvironment) -> None:
    scenario = Scenario()
    result = await run(env, scenario)
    assert result["state"] == "completed" and scenario.model_calls == []


async def test_a_continuation_started_with_the_earlier_carried_state_resumes(
        env: WorkflowEnvironment) -> None:
    """A run that continued as new before the state was one dataclass handed its
    continuation the eight fields of `CarriedState` (JSON under these names, as open runs
    hold them today): it starts on this code, resumes after planning without extracting or
    planning again, and its next wait follows the carried wait counter and owner."""
    scenario = Scenario(plan=planned(intent_needs_approval=True))
    carried = {"plan": asdict(scenario.plan), "owner": "desk-2", "escalation_hours": 1.0,
               "operations": {action: {"op_key": f"wf:{action}", "status": "pending",
                                       "destination_id": None}
                              for action in ("crm-upsert", "crm-note", "send")},
               "approved_by": "reviewer:dana", "send_followup": True, "wait_seq": 3,
               "card_url": "https://desk.example/review/x"}

    async def approve(handle: WorkflowHandle[Any, Any]) -> None:
        status = await wait_for_state(handle, "awaiting_review")
        assert status["review"]["wait_id"] == "w4-followup"
        assert status["review"]["owner"] == "desk-2"
        await decide(handle, Decision.APPROVE)

    result = await run(env, scenario, approve,
                       params={"event_id": "e-1", "tenant": "acme", "carried": carried})
    assert (result["state"], result["reason"]) == ("completed", "followup_sent")
    assert result["operations"] == {"crm-upsert": "completed", "crm-note": "completed",
                                    "send": "completed"}
    assert scenario.calls["extract"] == 0 and scenario.calls["plan"] == 0
    assert scenario.calls["intent_approved"] == 1 and scenario.calls["send"] == 1


async def test_a_parked_item_continues_as_new_with_its_whole_state(
        env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reviewed, planned, then parked past the history limit: the run continues as new with
    the workflow state whole (`WorkflowState`), so the continuation's follow-up wait is the
    item's second wait, and nothing before it runs again."""
    monkeypatch.setattr(step_options, "HISTORY_LIMIT", 60)
    start = await env.get_current_time()
    scenario = Scenario(route="review", reasons=["prompt_injection"],
                        plan=planned(intent_needs_approval=True),
                        crm_parked_until=start + timedelta(hours=6),
                        clock=env.get_current_time)
    started: list[WorkflowHandle[Any, Any]] = []
    followup: list[dict[str, Any]] = []

    async def approve_both(handle: WorkflowHandle[Any, Any]) -> None:
        await wait_for_state(handle, "awaiting_review")
        await decide(handle, Decision.APPROVE)
        await env.sleep(timedelta(hours=7))  # parked for six (the test server skips them)
        for _ in range(400):
            status: dict[str, Any] = await handle.query(QUERY_STATUS)
            if status["review"] is not None and status["review"]["wait_id"].endswith(
                    "-followup"):
                break
            await asyncio.sleep(0.05)
        followup.append(status["review"])
        await decide(handle, Decision.APPROVE)

    result = await run(env, scenario, approve_both, started=started)
    assert (result["state"], result["reason"]) == ("completed", "followup_sent")
    handle = started[0]
    assert (await handle.describe()).run_id != handle.first_execution_run_id  # continued
    assert followup[0]["wait_id"] == "w2-followup"
    assert scenario.calls["extract"] == 1 and scenario.calls["plan"] == 1
    carried = None
    first = env.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    async for event in first.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            attrs = event.workflow_execution_continued_as_new_event_attributes
            [carried] = await env.client.data_converter.decode(
                attrs.input.payloads, [InboundEmailInput])
    assert isinstance(carried, InboundEmailInput) and carried.carried is not None
    state = carried.carried
    assert (state.plan, state.wait_seq, state.approved_by) == (
        scenario.plan, 1, "temporal:no identity")
    assert state.operations["crm-upsert"].op_key == "wf:crm-upsert"
