"""The invariant checker (`inboxcrm check`): passes on clean items, and flags each seeded
violation by ID — never by address. Other tests share this database and sandbox, so every
check here is scoped to this test's own workflow IDs."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.check import check_invariants
from inboxcrm.verify.probe import StackClient, message_from, unique_email

MAILBOX_PREFIX = "inbound/acme/standard/sales@acme.test/"


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=stack.env,
                          capture_output=True, text=True, timeout=120, check=False)


@dataclass
class Clean:
    scope: str
    tag: str
    workflow_id: str
    email: str
    contact_id: str
    event_id: str


@pytest.fixture
async def clean(env: StackClient, db: asyncpg.Pool) -> AsyncIterator[Clean]:
    """One delivery processed end to end, under a scope of its own."""
    tag = uuid.uuid4().hex[:8]
    email = unique_email("checked")
    workflow_id = await env.deliver(message_from(email), f"check-{tag}-1")
    await env.wait_state(workflow_id, "completed")
    row = await db.fetchrow("SELECT contact_id::text, event_id::text FROM inbound_events"
                            " WHERE workflow_id = $1", workflow_id)
    assert row is not None
    yield Clean(f"{MAILBOX_PREFIX}check-{tag}-", tag, workflow_id, email, row["contact_id"],
                row["event_id"])


async def test_clean_items_pass(clean: Clean, stack: Stack, db: asyncpg.Pool) -> None:
    report = await check_invariants(db, stack.sandbox_url, settled=True, scope=clean.scope)

    assert report.ok, report.to_json()
    assert report.destination is not None
    examined = {r.name: r.examined for r in report.results}
    assert examined["one_ledger_row_per_delivery"] == 1
    assert examined["one_contact_per_identity"] == 1
    assert examined["one_crm_record_per_contact"] == 1
    assert examined["one_email_per_intent"] == 1
    assert examined["attempts_within_budget"] >= 2  # CRM upsert, send (and the CRM note)
    assert report.in_flight == []


async def test_without_a_destination_the_destination_checks_are_skipped(
    clean: Clean, db: asyncpg.Pool,
) -> None:
    report = await check_invariants(db, None, settled=True, scope=clean.scope)

    assert report.ok
    assert report.destination is None and "skipped" in report.destination_note
    assert report.result("one_crm_record_per_contact").skipped
    assert report.result("sent_intents_exist_at_destination").skipped
    assert report.result("one_email_per_intent").skipped  # the store part still ran
    assert report.result("one_ledger_row_per_delivery").skipped is None
    assert report.to_json()["destination"]["checked"] is False


async def test_seeded_violations_are_flagged_by_id(
    clean: Clean, env: StackClient, stack: Stack, db: asyncpg.Pool,
) -> None:
    sandbox = stack.sandbox_url
    orphan = f"{clean.scope}orphan"
    in_flight = f"{clean.scope}inflight"
    try:
        # a second CRM record carrying our contact ID (created under another unique property)
        response = await env.http.post(
            f"{sandbox}/crm/v3/objects/contacts/batch/upsert",
            json={"inputs": [{"idProperty": "legacy_id", "id": f"legacy-{clean.tag}",
                              "properties": {"inboxcrm_contact_id": clean.contact_id,
                                             "email": unique_email("dupe")}}]})
        assert response.status_code == 200, response.text
        duplicate_record = response.json()["results"][0]["id"]
        first_record = await db.fetchval(
            "SELECT crm_record_id FROM contacts WHERE contact_id = $1::uuid", clean.contact_id)
        # an email to our contact with an idempotency key we never issued
        response = await env.http.post(
            f"{sandbox}/emails", headers={"Idempotency-Key": str(uuid.uuid4())},
            json={"from": "stray@acme.test", "to": [clean.email], "subject": "stray"})
        assert response.status_code == 200, response.text
        stray_email = response.json()["id"]
        ours = [m for m in (await env.sandbox_state())["emails"]
                if m["to"] == [clean.email] and m["id"] != stray_email]
        assert len(ours) == 1
        # a suppression recorded an hour before both emails
        await db.execute(
            "INSERT INTO suppressions (tenant, canonical_email, reason, source, created_at)"
            " VALUES ('acme', lower($1), 'seeded', 'test_check', now() - interval '1 hour')",
            clean.email)
        # an item blocked with no review task, whose operation overran its budget; an item
        # still in flight; an open review task left on a completed item
        event_ids = {}
        for workflow_id, state in ((orphan, "blocked"), (in_flight, "crm_pending")):
            event_ids[workflow_id] = await db.fetchval(
                "INSERT INTO inbound_events (tenant, source, mailbox, delivery_id, workflow_id,"
                " content_sha256, size_bytes, state, reason, workflow_started_at)"
                " VALUES ('acme', 'standard', 'sales@acme.test', $1, $2, 'seeded', 0, $3,"
                " 'seeded', now()) RETURNING event_id",
                workflow_id.rsplit("/", 1)[1], workflow_id, state)
        await db.execute(
            "INSERT INTO operations (op_key, workflow_id, event_id, action, status, attempts,"
            " max_attempts) VALUES ($1, $2, $3, 'crm-upsert', 'waiting', 7, 6)",
            f"{orphan}:crm-upsert", orphan, event_ids[orphan])
        await db.execute(
            "INSERT INTO review_tasks (event_id, workflow_id, tenant, reason, owner,"
            " escalate_at) VALUES ($1::uuid, $2, 'acme', 'seeded', 'sales-ops',"
            " now() + interval '1 day')", clean.event_id, clean.workflow_id)

        report = await check_invariants(db, sandbox, scope=clean.scope)

        def flagged(name: str) -> set[str]:
            return set(report.result(name).violations)

        assert flagged("one_crm_record_per_contact") == {
            f"contact:{clean.contact_id} records:"
            + ",".join(sorted([str(first_record), str(duplicate_record)]))}
        assert flagged("one_email_per_intent") == {f"email:{stray_email} unknown_key"}
        assert flagged("no_email_after_suppression") == {
            f"email:{ours[0]['id']}", f"email:{stray_email}"}
        assert flagged("every_item_terminal_or_owned") == {
            f"{orphan} state:blocked no_owned_task"}
        assert flagged("attempts_within_budget") == {f"{orphan}:crm-upsert attempts:7/6"}
        assert flagged("no_open_task_on_terminal_item") == {
            f"{clean.workflow_id} state:completed open_task"}
        assert report.in_flight == [in_flight]
        assert flagged("one_ledger_row_per_delivery") == set()
        assert flagged("one_contact_per_identity") == set()
        assert not report.ok

        settled = await check_invariants(db, sandbox, settled=True, scope=clean.scope)
        assert set(settled.result("every_item_terminal_or_owned").violations) == {
            f"{orphan} state:blocked no_owned_task", f"{in_flight} state:crm_pending in_flight"}

        # The operator's command: the same findings, IDs only, non-zero exit.
        result = cli(stack, "check", "--json", "--scope", clean.scope)
        assert result.returncode == 1, result.stderr
        body = json.loads(result.stdout)
        assert body["ok"] is False and body["destination"]["checked"] is True
        by_name = {c["name"]: c for c in body["checks"]}
        assert by_name["attempts_within_budget"]["ids"] == [f"{orphan}:crm-upsert attempts:7/6"]
        assert by_name["one_email_per_intent"]["violations"] == 1
        text = cli(stack, "check", "--scope", clean.scope)
        assert text.returncode == 1
        for output in (result.stdout, text.stdout, text.stderr):
            assert clean.email not in output and clean.email.lower() not in output
    finally:
        await db.execute("DELETE FROM operations WHERE workflow_id = ANY($1::text[])",
                         [orphan, in_flight])
        await db.execute("DELETE FROM inbound_events WHERE workflow_id = ANY($1::text[])",
                         [orphan, in_flight])
        await db.execute("DELETE FROM review_tasks WHERE workflow_id = $1 AND reason = 'seeded'",
                         clean.workflow_id)
        await db.execute("DELETE FROM suppressions WHERE source = 'test_check'"
                         " AND canonical_email = lower($1)", clean.email)


async def test_cli_check_passes_on_a_clean_scope(clean: Clean, stack: Stack) -> None:
    result = cli(stack, "check", "--json", "--settled", "--scope", clean.scope)

    assert result.returncode == 0, result.stdout + result.stderr
    body = json.loads(result.stdout)
    assert body["ok"] is True and body["settled"] is True
    assert {c["name"] for c in body["checks"]} >= {
        "one_ledger_row_per_delivery", "one_contact_per_identity", "one_crm_record_per_contact",
        "one_email_per_intent", "no_email_after_suppression", "every_item_terminal_or_owned",
        "attempts_within_budget"}
    skipped = cli(stack, "check", "--no-destination", "--scope", clean.scope)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "destination checks skipped" in skipped.stdout
