"""Retention: purge keeps the decision trail; forget removes a person's data and says so."""

from __future__ import annotations

import json

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import cli


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
