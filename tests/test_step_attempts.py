"""Resume from stored evidence (docs/architecture.md §3): the extraction is stored once per
event and reused by every re-run, and the steps outside the ledger have durable attempt
counts, so a message that keeps killing the worker ends `blocked / crash_loop` in the queue
instead of being retried forever (with real kills: tests/test_worker_exits.py)."""

from __future__ import annotations

import asyncpg
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.extract import ExtractActivities
from inboxcrm.domain.extraction.minimise import MinimisedMessage
from inboxcrm.domain.extraction.rules import RulesExtractor
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from schemas.extraction import Extraction
from schemas.models import ItemRef
from schemas.outcomes import ErrorType
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
