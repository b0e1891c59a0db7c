"""Determinism guard: histories replay against today's workflow code.

Two kinds:
- live histories, produced by the real worker in this session (catches a change that breaks
  the histories being written now): here, on the stack;
- stored histories under `tests/histories/`, written by an earlier version of the workflow
  (catches a change that breaks workflows already running in production: wrap such changes
  in `workflow.patched`): `tests/fast/test_replay_stored.py`, in the fast tier (the
  Replayer needs no server).

To add stored histories from the current code, run this file with
`INBOXCRM_CAPTURE_HISTORIES=<label>`; it writes `tests/histories/<label>-<scenario>.json`.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Replayer, Worker

from inboxcrm.platform import temporal
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.contract import WORKFLOW_TYPE
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow
from tests.helpers.cli import cli
from tests.helpers.histories import store_history
from tests.helpers.messages import no_sender_message

# The query docs/architecture.md §5 gives operators: the open runs this code cannot replay.
RETIRED_RUNS = ("WorkflowType = 'InboundEmailWorkflow' AND ExecutionStatus = 'Running' AND "
                "(TemporalChangeVersion IS NULL OR TemporalChangeVersion NOT IN "
                "('patches-of-0.2'))")


@workflow.defn(name=WORKFLOW_TYPE, sandboxed=False)
class RunOf010:
    """Stands for an open run of 0.1.0 in visibility: its first patch is `local-steps`."""

    @workflow.run
    async def run(self) -> None:
        workflow.patched("local-steps")
        await workflow.sleep(timedelta(hours=1))


async def _count(client: Client, query: str, expected: int) -> int:
    """Visibility is eventually consistent: the count once it reaches `expected`, or the
    last count after a few seconds."""
    count = -1
    for _ in range(50):
        count = (await client.count_workflows(query)).count
        if count == expected:
            break
        await asyncio.sleep(0.2)
    return count


def test_the_documented_query_is_the_one_tested() -> None:
    text = " ".join((Path(__file__).parents[1] / "docs" / "architecture.md").read_text().split())
    assert RETIRED_RUNS in text


async def test_the_query_finds_the_open_runs_this_code_cannot_replay(
        app_settings: Settings, env: StackClient) -> None:
    """On the dev server's visibility store: a run that recorded only `local-steps` (as a
    0.1.0 run does) is found; an open run of this code, parked, is not."""
    client = await temporal.connect(app_settings)
    queue = f"retired-{uuid.uuid4().hex[:8]}"
    old_id = f"retired-run-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[RunOf010]):
        old = await client.start_workflow(RunOf010.run, id=old_id, task_queue=queue)
        try:
            assert await _count(client, f"WorkflowId = '{old_id}' AND TemporalChangeVersion = "
                                "'local-steps'", 1) == 1
            assert await _count(client, f"{RETIRED_RUNS} AND WorkflowId = '{old_id}'", 1) == 1
        finally:
            await old.terminate("test over")
    assert await _count(client, f"{RETIRED_RUNS} AND WorkflowId = '{old_id}'", 0) == 0


async def test_histories_replay_deterministically(env: StackClient, app_settings: Settings,
                                                 stack: Stack) -> None:
    assert cli(stack, "pause", "--tenant", "acme", "--scope", "send").returncode == 0
    try:
        paused = await env.deliver(message_from(unique_email("replaypaused")))
        await env.wait_state(paused, "send_pending")
        await asyncio.sleep(6)  # parked, checked once more
        # Open and of this code: its marker is in visibility, the retired runs' query skips it.
        client = await temporal.connect(app_settings)
        assert await _count(client, f"WorkflowId = '{paused}' AND ExecutionStatus = 'Running' "
                            "AND TemporalChangeVersion = 'patches-of-0.2'", 1) == 1
        assert await _count(client, f"{RETIRED_RUNS} AND WorkflowId = '{paused}'", 0) == 0
    finally:
        assert cli(stack, "resume", "--tenant", "acme", "--scope", "send").returncode == 0
    happy = await env.deliver(message_from(unique_email("replay")))
    reviewed = await env.deliver(no_sender_message())
    await env.wait_state(happy, "completed")
    await env.wait_state(reviewed, "awaiting_review")
    await env.inject("crm.upsert", "invalid_field")
    blocked = await env.deliver(message_from(unique_email("replayblocked")))

    await env.wait_state(reviewed, "awaiting_review")
    await env.signal(reviewed, "hold", {"reviewer": "dana"})
    await env.wait_state(reviewed, "held")
    await env.signal(reviewed, "approve", {"reviewer": "dana",
                                           "corrections": {"sender_email": unique_email("r")}})
    await env.wait_state(blocked, "blocked")
    await env.signal(blocked, "retry", {"reviewer": "dana"})
    scenarios = {"happy": happy, "reviewed": reviewed, "blocked-retried": blocked,
                 "paused-woken": paused}
    for workflow_id in scenarios.values():
        await env.wait_state(workflow_id, "completed")

    client = await temporal.connect(app_settings)
    replayer = Replayer(workflows=[InboundEmailWorkflow], data_converter=client.data_converter)
    label = os.environ.get("INBOXCRM_CAPTURE_HISTORIES")
    for name, workflow_id in scenarios.items():
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
        assert result.replay_failure is None
        if label:
            store_history(history, f"{label}-{name}", app_settings)
