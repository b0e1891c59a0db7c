"""`failed` is written and queued (docs/architecture.md §3): a run that ends without settling
its item (here: terminated by an operator while it waited for review) leaves the item in a
state that says it is moving; the relay's sweeper writes it `failed` with the reason and puts
it in the owned queue (`inboxcrm queue`, `GET /review/`); `inboxcrm replay` runs it again and
answers that queue entry."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from temporalio.client import WorkflowExecutionStatus

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient
from tests.helpers.cli import cli
from tests.helpers.messages import no_sender_message


def queued(stack: Stack, workflow_id: str) -> dict[str, Any] | None:
    listing = cli(stack, "queue", "--json")
    assert listing.returncode == 0, listing.stderr
    return next((item for item in json.loads(listing.stdout)
                 if item["workflow_id"] == workflow_id), None)


async def test_a_terminated_run_is_failed_in_the_queue_and_replay_takes_it_again(
        env: StackClient, stack: Stack) -> None:
    workflow_id = await env.deliver(no_sender_message())
    await env.wait_state(workflow_id, "awaiting_review")
    client = await env.temporal()
    handle = client.get_workflow_handle(workflow_id)
    await handle.terminate(reason="test: an operator ended the run")
    assert (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED

    assert await env.wait_state(workflow_id, "failed", timeout=30) == ("failed",
                                                                         "run_terminated")
    entry = queued(stack, workflow_id)
    assert entry is not None and (entry["state"], entry["reason"]) == ("failed",
                                                                       "run_terminated")
    desk = await env.http.get(f"{stack.relay_url}/review/", headers={
        "Authorization": f"Bearer {stack.env['INBOXCRM_REVIEW_TOKEN']}",
        "Accept": "application/json"})
    assert desk.status_code == 200 and workflow_id in desk.text
    card = await env.http.get(f"{stack.relay_url}/review/{quote(workflow_id, safe='')}",
                              headers={"Authorization":
                                       f"Bearer {stack.env['INBOXCRM_REVIEW_TOKEN']}"})
    assert card.status_code == 200 and "run_terminated" in card.text, card.text[:300]
    audit = await env.db.fetchval(
        "SELECT detail FROM audit_log WHERE workflow_id = $1 AND actor = 'sweeper'",
        workflow_id)
    assert (json.loads(audit) if isinstance(audit, str) else audit)["reason"] == \
        "run_terminated"

    replayed = cli(stack, "replay", workflow_id, "--reviewer", "dana", "--reason", "retry")
    assert replayed.returncode == 0, replayed.stderr
    # Recorded as who authenticated (the operator's token here), the typed name a label.
    actor = await env.db.fetchval(
        "SELECT actor FROM audit_log WHERE workflow_id = $1 AND action = 'replayed'",
        workflow_id)
    assert actor == "operator"
    # The new run waits for the same review again; the `failed` entry is answered.
    await env.wait_for(lambda: env.db.fetchval(
        "SELECT state = 'awaiting_review' FROM inbound_events WHERE workflow_id = $1",
        workflow_id), what="the replayed run waiting for review")
    tasks = await env.db.fetch("SELECT reason, status, resolution FROM review_tasks "
                               "WHERE workflow_id = $1 ORDER BY task_id", workflow_id)
    assert [(t["reason"], t["status"], t["resolution"]) for t in tasks] == [
        ("run_terminated", "resolved", "replayed"), ("missing_sender", "open", None)]
    entry = queued(stack, workflow_id)
    assert entry is not None and entry["state"] == "awaiting_review"
    assert cli(stack, "review", "reject", workflow_id, "--reviewer", "dana").returncode == 0
    await env.wait_state(workflow_id, "rejected")
