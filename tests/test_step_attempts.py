"""Resume from stored evidence (docs/architecture.md §3): the extraction is stored once per
event and reused by every re-run, and the steps outside the ledger have durable attempt
counts, so a message that keeps killing the worker ends `blocked / crash_loop` in the queue
instead of being retried forever (with real kills: tests/test_worker_exits.py)."""

from __future__ import annotations

import asyncpg
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from inboxcrm.activities.extract import ExtractActivities
from inboxcrm.activities.match import MatchActivities
from inboxcrm.domain.extraction.minimise import MinimisedMessage
from inboxcrm.domain.extraction.rules import RulesExtractor
from inboxcrm.schemas.extraction import Extraction
from inboxcrm.schemas.models import ItemRef, PlanInput
from inboxcrm.schemas.outcomes import ErrorType
from inboxcrm.store.suppression import suppress_identity
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from inboxcrm.workflows.inbound_email import SEND_MAX_ATTEMPTS
from tests.helpers.time_skipping import stored_event


class CountingExtractor:
    """The rules extractor, counting how often it is asked (an LLM would cost and vary)."""

    def __init__(self) -> None:
        self._rules = RulesExtractor()
        self.name = self._rules.name
        self.version = self._rules.version
        self.calls = 0

    async def extract(self, message: MinimisedMessage) -> Extraction:
        self.calls += 1
        return await self._rules.extract(message)


async def test_a_rerun_reuses_the_stored_extraction(env: StackClient, db: asyncpg.Pool) -> None:
    event_id, workflow_id = await stored_event(db, message_from(unique_email("stored")))
    item = ItemRef(event_id=event_id, workflow_id=workflow_id, tenant="acme")
    extractor = CountingExtractor()
    activities = ExtractActivities(db, extractor, 30.0)

    first = await ActivityEnvironment().run(activities.extract_message, item)
    again = await ActivityEnvironment().run(activities.extract_message, item)  # a crash re-run

    assert extractor.calls == 1
    assert (again.route, again.reasons) == (first.route, first.reasons)
    assert await env.count("SELECT count(*) FROM audit_log WHERE workflow_id = $1 "
                           "AND action = 'extracted'", workflow_id) == 1


async def test_a_draining_worker_starts_no_extraction(env: StackClient, db: asyncpg.Pool) -> None:
    """On a worker that is shutting down the step is refused before it starts: the model is
    not asked, nothing is counted toward a crash loop, and the workflow hands the step to
    the next worker (tests/fast/test_workflow_branches.py; a real SIGTERM in
    tests/test_worker_exits.py)."""
    event_id, workflow_id = await stored_event(db, message_from(unique_email("draining")))
    item = ItemRef(event_id=event_id, workflow_id=workflow_id, tenant="acme")
    extractor = CountingExtractor()
    shutting_down = ActivityEnvironment()
    shutting_down.worker_shutdown()

    with pytest.raises(ApplicationError) as refused:
        await shutting_down.run(ExtractActivities(db, extractor, 30.0).extract_message, item)

    assert refused.value.type == ErrorType.WORKER_DRAINING.value and refused.value.non_retryable
    assert extractor.calls == 0
    assert await env.count("SELECT count(*) FROM step_attempts WHERE workflow_id = $1",
                           workflow_id) == 0


async def test_a_rerun_of_planning_keeps_the_first_runs_decisions(
        env: StackClient, db: asyncpg.Pool) -> None:
    """A killed worker's planning runs again (a local step's result dies with its worker),
    possibly after the world moved on: here the person opted out in between. The re-run
    keeps the first run's contact decision and follow-up, so the send step, which alone
    knows whether an attempt may have gone out, decides what happens to it; a re-plan would
    report the item `suppressed` while its email might already be out."""
    email = unique_email("replanned")
    event_id, workflow_id = await stored_event(db, message_from(email))
    item = ItemRef(event_id=event_id, workflow_id=workflow_id, tenant="acme")
    await ActivityEnvironment().run(
        ExtractActivities(db, RulesExtractor(), 30.0).extract_message, item)
    planner = MatchActivities(db)

    first = await ActivityEnvironment().run(planner.match_and_plan, PlanInput(item))
    async with db.acquire() as conn, conn.transaction():
        await suppress_identity(conn, "acme", email.lower(), reason="unsubscribe",
                                source="test", cancel_reason="unsubscribed")
    again = await ActivityEnvironment().run(planner.match_and_plan, PlanInput(item))

    assert first.send_op_key is not None and first.intent_id is not None
    assert (again.outcome, again.contact_id, again.crm_op_key, again.send_op_key,
            again.intent_id) == (first.outcome, first.contact_id, first.crm_op_key,
                                 first.send_op_key, first.intent_id)
    assert await env.count("SELECT count(*) FROM audit_log WHERE workflow_id = $1 "
                           "AND action = 'contact_matched'", workflow_id) == 1
    # The queued intent itself was cancelled by the opt-out: the send step will say so.
    assert await db.fetchval("SELECT status FROM followup_intents WHERE intent_id = $1::uuid",
                             first.intent_id) == "cancelled"


async def test_planning_a_followup_writes_it_whole_and_clears_its_count(
        env: StackClient, db: asyncpg.Pool) -> None:
    """The planned follow-up is one statement (`intents.PLAN_FOLLOWUP`): the template version,
    the intent, the send operation naming it, the audit entry with the intent's fields, and
    the planning step's attempt count back to zero. A re-run reuses that plan (no second
    intent, operation, template version or `intent_created`) and leaves the count at zero."""
    event_id, workflow_id = await stored_event(db, message_from(unique_email("planned")))
    item = ItemRef(event_id=event_id, workflow_id=workflow_id, tenant="acme")
    await ActivityEnvironment().run(
        ExtractActivities(db, RulesExtractor(), 30.0).extract_message, item)
    planner = MatchActivities(db)

    for _ in range(2):
        plan = await ActivityEnvironment().run(planner.match_and_plan, PlanInput(item))
        assert plan.send_op_key is not None and plan.intent_id is not None
        assert await db.fetchval("SELECT started FROM step_attempts WHERE workflow_id = $1 "
                                 "AND step = 'plan'", workflow_id) == 0

    assert await env.count("SELECT count(*) FROM followup_intents WHERE event_id = $1::uuid",
                           event_id) == 1
    operation = await db.fetchrow("SELECT action, external_ref, max_attempts FROM operations "
                                  "WHERE op_key = $1", plan.send_op_key)
    assert operation is not None
    assert (operation["action"], operation["external_ref"],
            operation["max_attempts"]) == ("send", plan.intent_id, SEND_MAX_ATTEMPTS)
    intent = await db.fetchrow("SELECT tenant, template_id FROM followup_intents "
                               "WHERE intent_id = $1::uuid", plan.intent_id)
    assert intent is not None
    assert await env.count("SELECT count(*) FROM template_versions WHERE tenant = $1 "
                           "AND template_ref = $2", intent["tenant"], intent["template_id"]) == 1
    detail = await db.fetchval("SELECT detail FROM audit_log WHERE workflow_id = $1 "
                               "AND action = 'intent_created'", workflow_id)
    assert (detail["intent_id"], detail["needs_approval"], detail["template"]) == (
        plan.intent_id, False, intent["template_id"])
    assert set(detail) == {"intent_id", "rule_id", "rule_version", "template",
                           "needs_approval", "approval_reason"}
    assert await env.count("SELECT count(*) FROM audit_log WHERE workflow_id = $1 "
                           "AND action = 'followup_plan_reused'", workflow_id) == 1
