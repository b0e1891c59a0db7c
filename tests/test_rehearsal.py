"""`inboxcrm rehearse` against the test stack, for real: the runbook's cases (a worker killed
with SIGKILL inside the CRM call and started again, the pause procedure, a manual hand-off to
the owner the policy names) with the record, queue entry and evidence printed per case; and
the guard that asks the running workers, not the CLI's environment, what they would call."""

from __future__ import annotations

import asyncio
import json

import pytest

from inboxcrm.stack.processes import free_port
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient
from tests.helpers.cli import cli
from tests.helpers.own_worker import OwnWorker

NEW_CASES = ("worker kill -9 inside the CRM call → restart",
             "pause sends → item parks → resume",
             "blocked → hand-off to its owner → retry")


async def reported(env: StackClient, task_queue: str) -> int:
    return await env.count("SELECT count(*) FROM worker_destinations WHERE task_queue = $1 "
                           "AND tenant = 'rehearsal'", task_queue)


async def test_rehearse_refuses_a_worker_that_would_call_a_live_destination(
        stack: Stack, env: StackClient) -> None:
    """The CLI's own environment is the sandbox's; one running worker's mail URL is not: the
    rehearsal refuses, naming that worker, and runs nothing. Once the worker stops (it
    deletes its report on the way out) the guard has nothing against the stack again."""
    live_mail = f"http://127.0.0.1:{free_port()}"
    worker = OwnWorker(stack, INBOXCRM_MAIL_URL=live_mail)
    deliveries = await env.count("SELECT count(*) FROM inbound_events "
                                 "WHERE tenant = 'rehearsal'")
    try:
        worker.start()
        await env.wait_for(lambda: reported(env, worker.task_queue),
                           what="the worker's destination report")
        result = await asyncio.to_thread(cli, stack, "rehearse")
        assert result.returncode == 1, result.stdout + result.stderr
        assert "refuses to run while a worker would call anything else" in result.stderr
        assert worker.task_queue in result.stderr and live_mail in result.stderr
        assert f"would call mail resend at {live_mail}" in result.stderr
        assert await env.count("SELECT count(*) FROM inbound_events "
                               "WHERE tenant = 'rehearsal'") == deliveries  # ran nothing
    finally:
        worker.current.stop()
    assert await reported(env, worker.task_queue) == 0
    rows = await env.db.fetch("SELECT crm_url, mail_url FROM worker_destinations "
                              "WHERE tenant = 'rehearsal'")
    assert rows and all(r["mail_url"].startswith(stack.sandbox_url) for r in rows)


@pytest.mark.long
async def test_rehearse_runs_the_runbook_cases_and_shows_the_evidence(
        stack: Stack, env: StackClient) -> None:
    stack_workers = {name: proc.pid for name, proc in stack.processes.items()
                     if name.startswith("worker")}
    result = await asyncio.to_thread(lambda: cli(stack, "rehearse", "--json", timeout=900))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads(result.stdout)
    cases = {case["scenario"]: case for case in report["scenarios"]}
    assert report["failed"] == 0 and set(NEW_CASES) <= set(cases)
    # The stack's own workers were never killed: the restart used the rehearsal's own.
    assert {name: proc.pid for name, proc in stack.processes.items()
            if name.startswith("worker")} == stack_workers
    assert all(proc.alive() for name, proc in stack.processes.items()
               if name.startswith("worker"))

    for name in NEW_CASES:
        case = cases[name]
        # One record at the sandbox, with its ID and the fields written.
        [record] = await env.crm_records_for(case["record"]["fields"]["email"])
        assert case["record"]["id"] == str(record["id"])
        assert case["evidence"]["command"] == f"inboxcrm audit --workflow {case['workflow_id']}"
        ids = await env.db.fetch("SELECT audit_id FROM audit_log WHERE workflow_id = $1 "
                                 "ORDER BY audit_id", case["workflow_id"])
        assert case["evidence"]["audit_ids"] == [r["audit_id"] for r in ids]

    restart = cases[NEW_CASES[0]]
    assert "killed pid" in restart["note"]
    held = [c for c in await env.calls("crm.upsert") if c["outcome"] == "timeout_before_commit"]
    assert held, "the kill was not inside a held CRM call"
    pause = cases[NEW_CASES[1]]
    story = cli(stack, "audit", "--workflow", pause["workflow_id"])
    assert "state → completed" in story.stdout
    handoff = cases[NEW_CASES[2]]["queue_entry"]
    assert handoff["owner"] == "rehearsal-integration"  # policies/rehearsal.json `owners`
    assert handoff["reason"].startswith("http_401") and handoff["escalate_at"]
    assert handoff["status"] == "resolved"
    paused = await env.count("SELECT count(*) FROM audit_log WHERE tenant = 'rehearsal' AND "
                             "action IN ('paused', 'resumed') AND actor = 'rehearsal'")
    assert paused >= 2

    text = await asyncio.to_thread(lambda: cli(stack, "rehearse", timeout=900))
    assert text.returncode == 0, text.stdout[-4000:]
    assert f"{report['passed']} passed, 0 failed" in text.stdout
    assert "queue entry: http_401" in text.stdout and "owner rehearsal-integration" in text.stdout
    assert "evidence: audit entries" in text.stdout and "inboxcrm audit --workflow" in text.stdout
    # A line per scenario on stderr as it runs; stdout is the table alone.
    assert f"[1/{report['passed']}] duplicate delivery…" in text.stderr
    assert f"[1/{report['passed']}]" not in text.stdout
    # Every rehearsal item's story can be reconstructed from the audit trail alone.
    rows = await env.db.fetch(
        "SELECT DISTINCT ON (state) workflow_id, state FROM inbound_events "
        "WHERE tenant = 'rehearsal' ORDER BY state, received_at DESC")
    assert {r["state"] for r in rows} >= {"completed", "ignored", "rejected", "suppressed"}
    for row in rows:
        story = cli(stack, "audit", "--workflow", row["workflow_id"])
        assert story.returncode == 0, story.stderr
        assert "received via standard" in story.stdout
        assert f"state → {row['state']}" in story.stdout

