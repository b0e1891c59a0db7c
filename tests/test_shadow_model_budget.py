"""Shadow mode's second opinion from a model runs inside the local shadow step, where the
model queue's rate limit (`INBOXCRM_MODEL_CALLS_PER_SECOND`) cannot see it: the worker gives
it a budget of its own (`inboxcrm.platform.call_budget`). Past the budget an item is
compared no further and still planned; the model is not called (counted at the stub)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import asyncpg
import pytest
from temporalio.testing import ActivityEnvironment

from inboxcrm.activities.extract import ExtractActivities
from inboxcrm.activities.shadow import ShadowActivities
from inboxcrm.domain.extraction.llm import LLMExtractor
from inboxcrm.domain.extraction.rules import RulesExtractor
from inboxcrm.domain.shadow import comparison_extractor
from inboxcrm.platform.call_budget import CallBudget
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.models import ItemRef
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.llm_stub import StubServer, content
from tests.helpers.time_skipping import stored_event

ANSWER = {"sender_email": {"value": None, "confidence": 0.0, "evidence": None},
          "contact_name": {"value": None, "confidence": 0.0, "evidence": None},
          "company": {"value": None, "confidence": 0.0, "evidence": None},
          "intent": "pricing_request", "possible_opt_out": False, "needs_human_review": True}


@pytest.fixture(scope="module")
def llm_stub() -> Iterator[StubServer]:
    server = StubServer().start()
    yield server
    server.stop()


async def _shadow_plan(db: asyncpg.Pool, shadow: ShadowActivities) -> dict[str, object]:
    event_id, workflow_id = await stored_event(db, message_from(unique_email("budget")))
    item = ItemRef(event_id=event_id, workflow_id=workflow_id, tenant="acme")
    await ActivityEnvironment().run(
        ExtractActivities(db, RulesExtractor(), 30.0).extract_message, item)
    await ActivityEnvironment().run(shadow.plan_in_shadow, item)
    plan = await db.fetchval("SELECT shadow_plan FROM inbound_events WHERE event_id = $1::uuid",
                             event_id)
    assert plan is not None
    return dict(plan)


async def test_second_opinions_past_the_budget_are_not_asked_for(
        env: StackClient, db: asyncpg.Pool, llm_stub: StubServer) -> None:
    model = comparison_extractor(Settings(extractor="rules", llm_base_url=llm_stub.base_url,
                                          llm_model="stub-model", llm_api_key="k"))
    assert isinstance(model, LLMExtractor)
    now = [0.0]
    budget = CallBudget(1.0, clock=lambda: now[0])  # one a second, the clock held still
    shadow = ShadowActivities(db, model, model_budget=budget)
    llm_stub.script(content(json.dumps(ANSWER)), content(json.dumps(ANSWER)))

    asked = await _shadow_plan(db, shadow)
    past = await _shadow_plan(db, shadow)
    now[0] += 1.0  # a second later the budget has one call again
    again = await _shadow_plan(db, shadow)

    assert len(llm_stub.requests) == 2
    assert asked["second_opinion"]["unavailable"] is None  # type: ignore[index]
    assert asked["second_opinion"]["route"] == "review"  # type: ignore[index]
    assert past["second_opinion"] == {"extractor": model.name, "route": None, "reasons": [],
                                      "differs": False, "unavailable": "rate_limited"}
    assert past["outcome"] == asked["outcome"]  # planned all the same, never held up
    assert again["second_opinion"]["unavailable"] is None  # type: ignore[index]
