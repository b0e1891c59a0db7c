"""Resume from stored evidence (docs/architecture.md §3): the extraction is stored once per
event and reused by every re-run, and the steps outside the ledger have durable attempt
counts, so a message that keeps killing the worker ends `blocked / crash_loop` in the queue
instead of being retried forever."""

from __future__ import annotations

import json
import uuid

import asyncpg
from temporalio.testing import ActivityEnvironment

from activities.extract import ExtractActivities
from activities.step_attempts import CRASH_LOOP_LIMIT
from inboxcrm.domain.extraction.minimise import MinimisedMessage
from inboxcrm.domain.extraction.rules import RulesExtractor
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from schemas.extraction import Extraction
from schemas.models import ItemRef, inbound_workflow_id
from tests.helpers.cli import cli
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


async def test_a_message_that_keeps_crashing_the_worker_ends_blocked_crash_loop(
        env: StackClient, db: asyncpg.Pool, stack: Stack) -> None:
    """The worker died CRASH_LOOP_LIMIT times inside this item's extraction (each death left
    its attempt counted): the next attempt stops the loop and asks a person."""
    email = unique_email("poison")
    delivery = f"D-{uuid.uuid4().hex[:12]}"
    workflow_id = inbound_workflow_id("acme", "standard", "sales@acme.test", delivery)
    await db.execute("INSERT INTO step_attempts (workflow_id, step, started) "
                     "VALUES ($1, 'extract', $2)", workflow_id, CRASH_LOOP_LIMIT)

    assert await env.deliver(message_from(email), delivery) == workflow_id

    assert await env.wait_state(workflow_id, {"blocked", "completed"}) == (
        "blocked", "crash_loop")
    queue = json.loads(cli(stack, "queue", "--json").stdout)
    assert [(i["reason"], i["state"]) for i in queue if i["workflow_id"] == workflow_id] == [
        ("crash_loop", "blocked")]
    # A person looked (say, the worker's memory limit was raised): retry starts a fresh count.
    await env.signal(workflow_id, "retry", {"reviewer": "dana"})
    await env.wait_state(workflow_id, "completed")
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1
