"""A tenant's retry settings reach the ledger (docs/architecture.md §4, "Retries"): the
planner writes the policy's `retries` as each operation's `max_attempts` and carries them in
the plan, so the workflow's retries (tests/fast/test_workflow_branches.py) and the ledger's
budget agree. Real PostgreSQL; the policy is acme's with `retries` set."""

from __future__ import annotations

import asyncpg
import pytest
from temporalio.testing import ActivityEnvironment

from inboxcrm.activities import match
from inboxcrm.activities.extract import ExtractActivities
from inboxcrm.activities.match import MatchActivities
from inboxcrm.domain.extraction.rules import RulesExtractor
from inboxcrm.domain.policy import Retries, RetrySettings, TenantPolicy, get_policy
from inboxcrm.schemas.models import ItemRef, PlanInput, StepRetry
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.time_skipping import stored_event

CRM = StepRetry(max_attempts=3, initial_seconds=2.0, maximum_seconds=30.0)
SEND = StepRetry(max_attempts=8, initial_seconds=5.0, maximum_seconds=300.0, backoff=3.0)


def _with_retries(policy: TenantPolicy) -> TenantPolicy:
    tuned = policy.model_copy(update={"retries": Retries(
        crm=RetrySettings.of(CRM), send=RetrySettings.of(SEND))})
    return tuned


async def test_the_tenants_retries_are_the_ledgers_budgets_and_the_plans(
        env: StackClient, db: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    acme = _with_retries(get_policy("acme"))
    monkeypatch.setattr(match, "get_policy", lambda tenant: acme)
    event_id, workflow_id = await stored_event(db, message_from(unique_email("retries")))
    item = ItemRef(event_id=event_id, workflow_id=workflow_id, tenant="acme")
    await ActivityEnvironment().run(
        ExtractActivities(db, RulesExtractor(), 30.0).extract_message, item)

    plan = await ActivityEnvironment().run(MatchActivities(db).match_and_plan, PlanInput(item))

    assert plan.outcome == "planned" and plan.send_op_key is not None
    assert (plan.crm_retry, plan.send_retry) == (CRM, SEND)
    budgets = {row["action"]: row["max_attempts"] for row in await db.fetch(
        "SELECT action, max_attempts FROM operations WHERE workflow_id = $1", workflow_id)}
    assert budgets == {"crm-upsert": 3, "crm-note": 3, "crm-email": 3, "crm-sent": 3,
                       "send": 8}
