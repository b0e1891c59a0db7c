"""`inboxcrm report rule-change` on the real stack (issue 37, Evidence): a worker of the
test's own plans two acme items under rule `ack` version 1; the rule is bumped to version 2
in its policy directory and a worker started on it plans a third. The report for version 2
lists exactly the two planned before (workflow ID, state, intent status, planned version and
time) with their count, and not the third; for version 1 nothing is older."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.own_worker import OwnWorker
from tests.helpers.stack import ROOT
from tests.helpers.time_skipping import stored_event

pytestmark = pytest.mark.asyncio(loop_scope="session")


def report(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", "report", "rule-change",
                           "--rule", "ack", "--tenant", "acme", *args], env=stack.env,
                          capture_output=True, text=True, timeout=60, check=False)


def _set_ack_version(directory: Path, version: int) -> None:
    path = directory / "acme.json"
    acme = json.loads(path.read_text())
    [rule] = [r for r in acme["followup_rules"] if r["rule_id"] == "ack"]
    rule["version"] = version
    path.write_text(json.dumps(acme), encoding="utf-8")


async def _run(worker: OwnWorker, env: StackClient, db: asyncpg.Pool) -> str:
    event_id, workflow_id = await stored_event(db, message_from(unique_email("rulechange")))
    handle = await worker.run_item(env, event_id, workflow_id)
    done = await asyncio.wait_for(handle.result(), timeout=90)
    assert (done.state, done.reason) == ("completed", "followup_sent")
    return workflow_id


async def test_the_report_lists_the_items_planned_under_the_older_rule_version(
        stack: Stack, env: StackClient, db: asyncpg.Pool,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    policies = tmp_path_factory.mktemp("rule-change") / "policies"
    shutil.copytree(ROOT / "policies", policies)
    _set_ack_version(policies, 1)
    worker = OwnWorker(stack, INBOXCRM_POLICY_DIR=str(policies))
    try:
        worker.start()
        before = [await _run(worker, env, db) for _ in range(2)]
        worker.stop_all()
        _set_ack_version(policies, 2)  # the rule changes; the next worker plans under it
        worker.start()
        after = await _run(worker, env, db)
    finally:
        worker.stop_all()
    stored = {r["workflow_id"]: r["rule_version"] for r in await db.fetch(
        "SELECT e.workflow_id, i.rule_version FROM followup_intents i JOIN inbound_events e "
        "USING (event_id) WHERE e.workflow_id = ANY($1::text[])", [*before, after])}
    assert stored[before[0]] == stored[before[1]] != stored[after]

    listed = report(stack, "--version", "2", "--json")
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    by_workflow = {i["workflow_id"]: i for i in found["items"]}
    assert set(before) <= set(by_workflow) and after not in by_workflow
    for workflow_id in before:
        item = by_workflow[workflow_id]
        assert (item["state"], item["intent_status"], item["planned_version"]) == (
            "completed", "sent", 1)
        assert item["rule_version"] == stored[workflow_id] and item["planned_at"]
    assert {i["planned_version"] for i in found["items"]} == {1}
    versions = {v["rule_version"]: v for v in found["versions"]}
    assert versions[stored[before[0]]]["older"] and versions[stored[before[0]]]["version"] == 1
    assert versions[stored[before[0]]]["items"] >= 2
    assert not versions[stored[after]]["older"] and versions[stored[after]]["version"] is None
    assert found["older_items"] == sum(v["items"] for v in found["versions"] if v["older"])

    text = report(stack, "--version", "2")
    assert text.returncode == 0, text.stderr
    lines = {line.split()[0]: line for line in text.stdout.splitlines() if line}
    assert "intent sent  planned v1" in lines[before[0]] and after not in lines
    assert f"{found['older_items']} item(s) of rule ack planned under a version older than v2" \
        in text.stdout

    none_older = report(stack, "--version", "1", "--json")
    assert none_older.returncode == 0, none_older.stderr
    assert json.loads(none_older.stdout)["items"] == []
