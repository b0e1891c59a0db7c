"""How a worker's exit meets the item it was working on (docs/architecture.md §4), with real
worker processes of the test's own (tests/helpers/own_worker.py) and the sandbox counting
on the destination side:

- a rollout (SIGTERM) in the middle of a CRM call drains: the call finishes and is recorded,
  nothing is re-run, and no new destination call begins on the draining worker;
- SIGTERM during an extraction: it finishes, and the next step waits for the next worker;
- a message that kills the worker again and again is not retried forever: after
  CRASH_LOOP_LIMIT deaths inside its extraction it is held as `blocked / crash_loop`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from temporalio.client import WorkflowHandle
from temporalio.worker import Replayer

from inboxcrm.activities.step_attempts import CRASH_LOOP_LIMIT
from inboxcrm.platform.config import Settings
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow
from inboxcrm.workflows.step_options import DRAIN_HANDOVER
from tests.helpers.cli import cli
from tests.helpers.histories import store_history
from tests.helpers.llm_stub import StubServer, content
from tests.helpers.own_worker import OwnWorker
from tests.helpers.time_skipping import stored_event


@pytest.fixture
def llm_stub() -> Iterator[StubServer]:
    server = StubServer().start()
    yield server
    server.stop()


def llm_settings(stub: StubServer) -> dict[str, str]:
    """A worker that extracts with the model behind `stub`."""
    return {"INBOXCRM_EXTRACTOR": "llm", "INBOXCRM_LLM_BASE_URL": stub.base_url,
            "INBOXCRM_LLM_API_KEY": "test-key", "INBOXCRM_LLM_MODEL": "stub-model"}


def llm_answer(email: str) -> dict[str, object]:
    """What the model answers about message_from(email): the schema of
    inboxcrm/domain/extraction/llm.py."""
    return {
        "sender_email": {"value": email, "confidence": 0.97, "evidence": email},
        "contact_name": {"value": "Jane Doe", "confidence": 0.9, "evidence": "Jane Doe"},
        "company": {"value": None, "confidence": 0.0, "evidence": None},
        "intent": "pricing_request", "possible_opt_out": False, "needs_human_review": False,
    }


@pytest.mark.slow
async def test_a_draining_worker_starts_no_new_side_effect(
        env: StackClient, db: asyncpg.Pool, stack: Stack, app_settings: Settings) -> None:
    """SIGTERM arrives while the CRM takes 8 s to answer the upsert. The draining worker
    finishes that call and records it, but does not begin the note or the email after it
    (each could outlast the pod's grace period and be cut off mid-call): it exits, and the
    next worker makes them, once."""
    worker = OwnWorker(stack, INBOXCRM_HTTP_TIMEOUT_SECONDS="20")
    email = unique_email("handedover")
    try:
        worker.start()
        await env.sandbox_config(hang_seconds=8)
        await env.inject("crm.upsert", "timeout_after_commit")
        event_id, workflow_id = await stored_event(db, message_from(email))
        handle = await worker.run_item(env, event_id, workflow_id)
        await env.wait_for(lambda: env.crm_records_for(email), what="the CRM committed")

        stopping = worker.current
        assert stopping.proc is not None
        stopping.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(stopping.proc.wait, 60) == 0, stopping.tail()
        upsert = await env.operation(f"{workflow_id}:crm-upsert")
        assert upsert is not None and (upsert["status"], upsert["attempts"]) == ("completed", 1)
        assert await env.emails_to(email) == []  # handed over, not begun
        send = await env.operation(f"{workflow_id}:send")
        assert send is None or send["attempts"] == 0

        worker.start()
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        worker.stop_all()
    assert (result.state, result.reason) == ("completed", "followup_sent")
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1
    assert await handover_timers(handle) == [DRAIN_HANDOVER]
    await replays(env, handle, "drain-handover-operation", app_settings)


async def replays(env: StackClient, handle: WorkflowHandle[Any, Any], scenario: str,
                  settings: Settings) -> None:
    """The history replays against today's code; with INBOXCRM_CAPTURE_HISTORIES=<label> it
    is stored as tests/histories/<label>-<scenario>.json for tests/test_replay.py."""
    history = await handle.fetch_history()
    client = await env.temporal()
    replayed = await Replayer(workflows=[InboundEmailWorkflow],
                              data_converter=client.data_converter).replay_workflow(history)
    assert replayed.replay_failure is None
    if label := os.environ.get("INBOXCRM_CAPTURE_HISTORIES"):
        store_history(history, f"{label}-{scenario}", settings)


async def model_calls(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The task queues the item's model calls were scheduled on (regular activities)."""
    history = await handle.fetch_history()
    return [e.activity_task_scheduled_event_attributes.task_queue.name for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name
            == "extract_with_model"]


async def handover_timers(handle: WorkflowHandle[Any, Any]) -> list[timedelta]:
    """The timers in the item's history: the handover from a draining worker is the only one
    a run without pauses, outages or reviews starts."""
    history = await handle.fetch_history()
    return [e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
            for e in history.events if e.HasField("timer_started_event_attributes")]


@pytest.mark.slow
async def test_sigterm_during_extraction_hands_the_next_step_over(
        env: StackClient, db: asyncpg.Pool, stack: Stack, llm_stub: StubServer,
        app_settings: Settings) -> None:
    """SIGTERM while the model takes 6 s to answer: the draining worker finishes the model
    call (a regular activity on the model's task queue) and stores the extraction, starts no
    planning (nothing counted toward a crash loop), and exits; the next worker plans and
    sends from the stored extraction without asking the model again. (Planning goes to the
    next worker by itself, or, if the draining worker took the workflow task, after one short
    handover timer.) The history replays (and is the stored example of this workflow version:
    INBOXCRM_CAPTURE_HISTORIES=<label>)."""
    email = unique_email("handover")
    llm_stub.script(content(json.dumps(llm_answer(email)), delay=6))
    worker = OwnWorker(stack, **llm_settings(llm_stub))
    try:
        worker.start()
        event_id, workflow_id = await stored_event(db, message_from(email))
        handle = await worker.run_item(env, event_id, workflow_id)

        async def asked() -> bool:
            return len(llm_stub.requests) == 1

        await env.wait_for(asked, what="the model was asked")
        stopping = worker.current
        assert stopping.proc is not None
        stopping.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(stopping.proc.wait, 60) == 0, stopping.tail()
        assert await env.count("SELECT count(*) FROM audit_log WHERE workflow_id = $1 "
                               "AND action = 'extracted'", workflow_id) == 1
        assert await env.count("SELECT count(*) FROM step_attempts WHERE workflow_id = $1 "
                               "AND step = 'plan'", workflow_id) == 0

        worker.start()
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        worker.stop_all()
    assert (result.state, result.reason) == ("completed", "followup_sent")
    assert len(llm_stub.requests) == 1
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1

    assert await handover_timers(handle) in ([], [DRAIN_HANDOVER])
    assert await model_calls(handle) == [f"{worker.task_queue}-model"]
    await replays(env, handle, "drain-handover-step", app_settings)


@pytest.mark.long
async def test_a_message_that_kills_the_worker_every_time_ends_blocked_crash_loop(
        env: StackClient, db: asyncpg.Pool, stack: Stack, llm_stub: StubServer) -> None:
    """Every time the worker asks the model about this message, the worker dies (kill -9
    while the request is open, as an out-of-memory kill would). Without durable counts each
    new worker would start again at attempt 1, forever; here the deaths are counted, and the
    attempt after the CRASH_LOOP_LIMIT-th stops without asking the model again. A reviewer's
    retry (the memory limit raised, say) then finishes the item once."""
    email = unique_email("poisonous")
    # Each deadly request is held open until the worker is gone; the one after the retry is
    # answered.
    llm_stub.script(*[content("{}", delay=120) for _ in range(CRASH_LOOP_LIMIT)],
                    content(json.dumps(llm_answer(email))))
    worker = OwnWorker(stack, **llm_settings(llm_stub))
    try:
        worker.start()
        event_id, workflow_id = await stored_event(db, message_from(email))
        handle = await worker.run_item(env, event_id, workflow_id)
        for death in range(1, CRASH_LOOP_LIMIT + 1):
            async def asked(times: int = death) -> bool:
                return len(llm_stub.requests) >= times

            await env.wait_for(asked, timeout=60, what=f"extraction attempt {death}")
            worker.current.kill()
            worker.start()

        assert await env.wait_state(workflow_id, {"blocked", "completed"}, timeout=60) == (
            "blocked", "crash_loop")
        assert len(llm_stub.requests) == CRASH_LOOP_LIMIT  # the model was not asked again
        queue = json.loads(cli(stack, "queue", "--json").stdout)
        assert [(i["reason"], i["state"]) for i in queue if i["workflow_id"] == workflow_id] == [
            ("crash_loop", "blocked")]
        assert await env.crm_records_for(email) == []

        await env.signal(workflow_id, "retry", {"reviewer": "dana"})
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        worker.stop_all()
    assert (result.state, result.reason) == ("completed", "followup_sent")
    assert len(llm_stub.requests) == CRASH_LOOP_LIMIT + 1
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1
