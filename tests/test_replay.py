"""Determinism guard: histories produced by the real worker replay against today's workflow
code. A change that would break running workflows fails here first (wrap such changes in
`workflow.patched`)."""

from __future__ import annotations

from temporalio.worker import Replayer

from inboxcrm import temporal
from inboxcrm.config import Settings
from inboxcrm.probe import StackClient, message_from, unique_email
from tests.test_review import no_sender_message
from workflows.inbound_email import InboundEmailWorkflow


async def test_histories_replay_deterministically(env: StackClient, app_settings: Settings) -> None:
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
    for workflow_id in (happy, reviewed, blocked):
        await env.wait_state(workflow_id, "completed")

    client = await temporal.connect(app_settings)
    replayer = Replayer(workflows=[InboundEmailWorkflow], data_converter=client.data_converter)
    for workflow_id in (happy, reviewed, blocked):
        history = await client.get_workflow_handle(workflow_id).fetch_history()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
        assert result.replay_failure is None
