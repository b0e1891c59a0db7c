"""Retention: purge keeps the decision trail; forget removes a person's data and says so."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from temporalio.client import ScheduleActionExecutionStartWorkflow, ScheduleActionStartWorkflow

from inboxcrm.platform.config import Settings
from inboxcrm.schemas.contract import RETENTION_WORKFLOW_TYPE, retention_schedule_id
from inboxcrm.schemas.retention import RetentionSummary
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import cli
from tests.test_sources import post_postmark, postmark


async def test_purge_deletes_raw_content_but_keeps_hashes_and_trail(
    env: StackClient, stack: Stack,
) -> None:
    old = await env.deliver(message_from(unique_email("old")))
    recent = await env.deliver(message_from(unique_email("recent")))
    await env.wait_state(old, "completed")
    await env.wait_state(recent, "completed")
    await env.db.execute("UPDATE inbound_events SET received_at = now() - interval '40 days' "
                         "WHERE workflow_id = $1", old)

    counted = cli(stack, "purge", "--older-than", "30", "--dry-run", "--json")
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout)["events"] >= 1 and json.loads(counted.stdout)["dry_run"]
    assert await env.db.fetchval("SELECT raw IS NOT NULL FROM inbound_events "
                                 "WHERE workflow_id = $1", old)  # nothing changed
    assert await env.count("SELECT count(*) FROM audit_log WHERE action = 'purged' "
                           "AND detail ->> 'older_than_days' = '30'") == 0

    result = cli(stack, "purge", "--older-than", "30", "--yes")

    assert result.returncode == 0, result.stderr
    row = await env.db.fetchrow("SELECT raw, content_sha256, route, extraction FROM "
                                "inbound_events WHERE workflow_id = $1", old)
    assert row["raw"] is None and len(row["content_sha256"]) == 64 and row["route"] == "auto"
    assert "sender_email" not in row["extraction"]
    assert await env.count("SELECT count(*) FROM audit_log WHERE workflow_id = $1", old) > 3
    assert await env.db.fetchval("SELECT raw IS NOT NULL FROM inbound_events "
                                 "WHERE workflow_id = $1", recent)
    assert cli(stack, "purge", "--older-than", "0").returncode == 1


async def test_forget_removes_personal_data_and_records_it(
    env: StackClient, stack: Stack,
) -> None:
    email = unique_email("forgetme")
    workflow_id = await env.deliver(message_from(email, name="Forget Me"))
    await env.wait_state(workflow_id, "completed")

    counted = cli(stack, "forget", "--email", email.upper(), "--dry-run", "--json")
    assert counted.returncode == 0, counted.stderr
    assert (json.loads(counted.stdout)["contacts"], json.loads(counted.stdout)["events"]) == (1, 1)
    assert await env.contacts_for(email) == 1  # nothing changed

    result = cli(stack, "forget", "--email", email.upper(), "--yes")

    assert result.returncode == 0, result.stderr
    assert await env.contacts_for(email) == 0
    assert await env.count("SELECT count(*) FROM contacts WHERE name = 'Forget Me'") == 0
    event = await env.db.fetchrow("SELECT raw, extraction, canonical_email, content_sha256 "
                                  "FROM inbound_events WHERE workflow_id = $1", workflow_id)
    assert (event["raw"], event["extraction"], event["canonical_email"]) == (None, None, None)
    assert event["content_sha256"]
    forgotten = await env.db.fetch("SELECT detail::text AS d FROM audit_log "
                                   "WHERE action = 'forgotten'")
    assert forgotten and all(email not in r["d"] for r in forgotten)
    everything = await env.db.fetchval(
        "SELECT string_agg(detail::text, ' ') FROM audit_log WHERE workflow_id = $1",
        workflow_id)
    assert email not in everything and "Forget Me" not in everything


async def test_export_returns_everything_held_about_a_person_and_records_it(
    env: StackClient, stack: Stack, tmp_path: Path,
) -> None:
    email = unique_email("exportme")
    other = unique_email("notme")
    first = await env.deliver(message_from(email, name="Export Me"))
    await env.wait_state(first, "completed")
    second = await env.deliver(message_from(email.upper(), name="Export Me"))
    unrelated = await env.deliver(message_from(other, name="Not Me"))
    await env.wait_state(second, {"completed", "suppressed"})
    await env.wait_state(unrelated, "completed")

    result = cli(stack, "export", "--email", email.upper(), "--tenant", "acme")

    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert [c["email"] for c in found["contacts"]] == [email]
    assert {m["workflow_id"] for m in found["messages"]} == {first, second}
    raw = base64.b64decode(found["messages"][0]["raw_base64"])
    assert email.encode() in raw.lower() and b"Export Me" in raw
    assert found["followups"] and {f["status"] for f in found["followups"]} >= {"sent"}
    assert {o["action"] for o in found["operations"]} >= {"crm-upsert"}
    assert {a["workflow_id"] for a in found["audit"]} >= {first, second}
    assert other not in result.stdout and unrelated not in result.stdout
    assert "Not Me" not in result.stdout
    exported = await env.db.fetch("SELECT detail FROM audit_log WHERE action = 'exported' "
                                  "AND tenant = 'acme' ORDER BY audit_id DESC LIMIT 1")
    assert exported[0]["detail"] == {"contacts": 1, "messages": 2}
    assert email not in json.dumps(exported[0]["detail"])

    target = tmp_path / "export.json"
    written = cli(stack, "export", "--email", email, "--tenant", "acme", "-o", str(target),
                  "--json")
    assert written.returncode == 0, written.stderr
    assert json.loads(written.stdout)["counts"]["contacts"] == 1
    assert json.loads(target.read_text())["contacts"] == found["contacts"]
    assert target.stat().st_mode & 0o777 == 0o600
    assert cli(stack, "export", "--email", email, "-o", str(target)).returncode == 1
    assert cli(stack, "export", "--email", "not an address").returncode == 1


async def test_the_providers_own_event_is_exported_purged_and_forgotten_with_the_message(
    env: StackClient, stack: Stack,
) -> None:
    """Postmark's JSON is kept next to the MIME rebuilt from it; an access request returns
    it, and purge and forget remove it with the raw message."""
    purged_email, forgotten_email = unique_email("pmpurge"), unique_email("pmforget")
    workflows = []
    for email in (purged_email, forgotten_email):
        payload = postmark(sender=email)
        response = await post_postmark(env, stack, payload)
        assert response.status_code == 200, response.text
        workflows.append(response.json()["workflow_id"])
        await env.wait_state(workflows[-1], "completed")
    purged, forgotten = workflows

    async def kept(workflow_id: str) -> int:
        return await env.count(
            "SELECT count(*) FROM provider_events JOIN inbound_events e USING (event_id)"
            " WHERE e.workflow_id = $1", workflow_id)

    assert (await kept(purged), await kept(forgotten)) == (1, 1)
    result = cli(stack, "export", "--email", forgotten_email, "--tenant", "acme")
    assert result.returncode == 0, result.stderr
    [message] = json.loads(result.stdout)["messages"]
    assert message["provider_event_type"] == "application/json"
    event = json.loads(base64.b64decode(message["provider_event_base64"]))
    assert event["FromFull"]["Email"] == forgotten_email

    await env.db.execute("UPDATE inbound_events SET received_at = now() - interval '40 days'"
                         " WHERE workflow_id = $1", purged)
    assert cli(stack, "purge", "--older-than", "30", "--yes").returncode == 0
    assert (await kept(purged), await kept(forgotten)) == (0, 1)
    assert cli(stack, "forget", "--email", forgotten_email, "--yes").returncode == 0
    assert await kept(forgotten) == 0
    assert await env.count("SELECT count(*) FROM inbound_events WHERE workflow_id = ANY($1)",
                           workflows) == 2  # the items and their trail stay


async def test_the_scheduled_retention_run_removes_what_is_past_its_period_and_says_so(
    env: StackClient, stack: Stack, app_settings: Settings,
) -> None:
    """acme's policy keeps messages and evidence 90 days and the audit trail 400: the run
    the stack's Schedule starts empties an item older than that and says so in its trail,
    and leaves a recent one alone."""
    old = await env.deliver(message_from(unique_email("retain-old")))
    recent = await env.deliver(message_from(unique_email("retain-new")))
    await env.wait_state(old, "completed")
    await env.wait_state(recent, "completed")
    await env.db.execute("UPDATE inbound_events SET received_at = now() - interval '100 days'"
                         " WHERE workflow_id = $1", old)
    await env.db.execute("UPDATE operations SET evidence = 'checked by hand', last_transition ="
                         " now() - interval '100 days' WHERE workflow_id = $1", old)
    ancient = await env.db.fetchval(
        "UPDATE audit_log SET at = now() - interval '500 days' WHERE audit_id = (SELECT"
        " min(audit_id) FROM audit_log WHERE workflow_id = $1) RETURNING audit_id", old)
    kept_audit = await env.count("SELECT count(*) FROM audit_log WHERE workflow_id = $1", old)

    client = await env.temporal()
    handle = client.get_schedule_handle(retention_schedule_id(app_settings.task_queue))
    action = (await handle.describe()).schedule.action  # registered by the stack
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert action.workflow == RETENTION_WORKFLOW_TYPE
    seen = {a.action.workflow_id for a in (await handle.describe()).info.recent_actions
            if isinstance(a.action, ScheduleActionExecutionStartWorkflow)}
    await handle.trigger()

    async def started() -> str | None:
        for recent_action in (await handle.describe()).info.recent_actions:
            run = recent_action.action
            if isinstance(run, ScheduleActionExecutionStartWorkflow) \
                    and run.workflow_id not in seen:
                return run.workflow_id
        return None

    run_id = await env.wait_for(started, timeout=60, what="the retention run started")
    summary = await client.get_workflow_handle(run_id, result_type=RetentionSummary).result()
    acme = next(t for t in summary.tenants if t.tenant == "acme")
    assert acme.raw >= 1 and acme.evidence >= 1 and acme.audit >= 1

    row = await env.db.fetchrow("SELECT raw, extraction, content_sha256 FROM inbound_events"
                                " WHERE workflow_id = $1", old)
    assert row["raw"] is None and "sender_email" not in row["extraction"]
    assert len(row["content_sha256"]) == 64
    assert await env.count("SELECT count(*) FROM operations WHERE workflow_id = $1"
                           " AND evidence IS NOT NULL", old) == 0
    assert await env.count("SELECT count(*) FROM audit_log WHERE audit_id = $1", ancient) == 0
    assert await env.count("SELECT count(*) FROM audit_log WHERE workflow_id = $1",
                           old) == kept_audit  # one entry gone, one entry saying so
    assert await env.db.fetchval("SELECT raw IS NOT NULL FROM inbound_events"
                                 " WHERE workflow_id = $1", recent)
    story = cli(stack, "audit", "--workflow", old)
    assert story.returncode == 0, story.stderr
    assert "retention: the stored message removed, older than 90 days" in story.stdout
    assert await env.count("SELECT count(*) FROM audit_log WHERE action = 'retention_run'"
                           " AND tenant = 'acme' AND (detail ->> 'raw')::int >= 1") >= 1
