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

from temporalio.worker import Replayer

from inboxcrm.platform import temporal
from inboxcrm.platform.config import Settings
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import cli
from tests.helpers.histories import store_history
from tests.helpers.messages import no_sender_message
from workflows.inbound_email import InboundEmailWorkflow


async def test_histories_replay_deterministically(env: StackClient, app_settings: Settings,
                                                 stack: Stack) -> None:
    assert cli(stack, "pause", "--tenant", "acme", "--scope", "send").returncode == 0
    try:
        paused = await env.deliver(message_from(unique_email("replaypaused")))
        await env.wait_state(paused, "send_pending")
        await asyncio.sleep(6)  # parked, checked once more
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
