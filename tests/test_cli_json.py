"""The console script against a running stack, as a script uses it: `--json` on stdout, the
newcomer's `send-test` then `status`, a decision's answer as JSON."""

from __future__ import annotations

import asyncio
import json

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient
from tests.helpers.cli import cli
from tests.helpers.messages import no_sender_message


async def test_send_test_then_status_as_the_quick_start_does(
    env: StackClient, stack: Stack,
) -> None:
    sent = cli(stack, "send-test", "--json")
    assert sent.returncode == 0, sent.stderr
    answer = json.loads(sent.stdout)
    assert answer["status"] == "accepted"
    workflow_id = answer["workflow_id"]
    assert workflow_id.startswith("inbound/acme/standard/sales@acme.test/test-")

    await env.wait_state(workflow_id, "completed")
    shown = cli(stack, "status", workflow_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "completed"
    assert json.loads(cli(stack, "status", workflow_id).stdout) == json.loads(shown.stdout)

    again = cli(stack, "send-test", "--json", "--delivery-id", workflow_id.rsplit("/", 1)[1])
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "duplicate"


async def test_a_decision_answers_in_json(env: StackClient, stack: Stack) -> None:
    workflow_id = await env.deliver(no_sender_message())
    await env.wait_state(workflow_id, "awaiting_review")

    decided = await asyncio.to_thread(cli, stack, "review", "reject", workflow_id,
                                      "--reviewer", "dana", "--json")

    assert decided.returncode == 0, decided.stderr
    answer = json.loads(decided.stdout)
    assert (answer["decision"], answer["workflow_id"]) == ("reject", workflow_id)
    assert answer["status"]["state"] == "rejected" and answer["wait_id"]
    refused = cli(stack, "review", "reject", workflow_id, "--reviewer", "dana", "--json")
    assert refused.returncode == 1 and refused.stdout == ""
