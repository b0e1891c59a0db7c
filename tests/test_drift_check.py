"""Destination truth: the scheduled drift check notices what was changed at the CRM behind
the product's back, reports it (table, metric, CLI), and replays deterministically."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from temporalio.client import (
    Client,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleHandle,
)
from temporalio.worker import Replayer

from inboxcrm.activities.drift import run_drift_check
from inboxcrm.adapters.base import (
    ContactFields,
    CrmRecordView,
    OutgoingEmail,
    SentRecord,
    Unverifiable,
)
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.resend import ResendMail
from inboxcrm.adapters.salesforce import SalesforceCrm
from inboxcrm.adapters.smtp import SmtpMail
from inboxcrm.platform import temporal
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.contract import DRIFT_CHECK_WORKFLOW_TYPE, drift_check_schedule_id
from inboxcrm.schemas.drift import DriftCheckRequest, DriftSummary, Trigger
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from inboxcrm.workflows.drift_check import DriftCheckWorkflow
from tests.helpers.cli import cli


async def _completed_contact(env: StackClient, db: asyncpg.Pool, prefix: str
                             ) -> tuple[str, str, str]:
    """Deliver one inquiry and wait for it: (workflow ID, contact ID, CRM record ID)."""
    email = unique_email(prefix)
    workflow_id = await env.deliver(message_from(email))
    await env.wait_state(workflow_id, "completed")
    row = await db.fetchrow("SELECT contact_id::text AS contact_id, crm_record_id FROM contacts"
                            " WHERE canonical_email = lower($1)", email)
    assert row is not None and row["crm_record_id"]
    return workflow_id, row["contact_id"], row["crm_record_id"]


async def _trigger_and_wait(client: Client, handle: ScheduleHandle) -> tuple[str, DriftSummary]:
    """Trigger the Schedule now (as its timer would) and wait for that run's result."""
    seen = {a.action.workflow_id for a in (await handle.describe()).info.recent_actions
            if isinstance(a.action, ScheduleActionExecutionStartWorkflow)}
    await handle.trigger()
    for _ in range(150):
        actions = (await handle.describe()).info.recent_actions
        started = [a.action for a in actions
                   if isinstance(a.action, ScheduleActionExecutionStartWorkflow)
                   and a.action.workflow_id not in seen]
        if started:
            run = client.get_workflow_handle(started[0].workflow_id,
                                             run_id=started[0].first_execution_run_id,
                                             result_type=DriftSummary)
            return started[0].workflow_id, await run.result()
        await asyncio.sleep(0.2)
    raise AssertionError("the triggered schedule started no run")


async def test_a_record_deleted_behind_our_back_is_reported_by_the_next_scheduled_run(
    env: StackClient, stack: Stack, db: asyncpg.Pool, app_settings: Settings,
) -> None:
    client = await env.temporal()
    handle = client.get_schedule_handle(drift_check_schedule_id(app_settings.task_queue))
    described = await handle.describe()  # registered by the stack, as by `make up`
    action = described.schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert action.workflow == DRIFT_CHECK_WORKFLOW_TYPE
    # Registering again is idempotent; here it widens the sample to every operation of
    # this session, so the run cannot miss the record below by chance.
    wide = app_settings.model_copy(update={"drift_check_sample_size": 10_000})
    assert await temporal.ensure_drift_check_schedule(client, wide) == "updated"

    deleted_wf, deleted_contact, deleted_record = await _completed_contact(env, db, "drift-del")
    changed_wf, changed_contact, changed_record = await _completed_contact(env, db, "drift-chg")
    intact_wf, intact_contact, _ = await _completed_contact(env, db, "drift-ok")
    sandbox = stack.sandbox_url
    response = await env.http.delete(f"{sandbox}/_sandbox/contacts/{deleted_record}")
    assert response.status_code == 200, response.text
    response = await env.http.patch(
        f"{sandbox}/_sandbox/contacts/{changed_record}",
        json={"properties": {app_settings.crm_id_property: str(uuid.uuid4())}})
    assert response.status_code == 200, response.text
    assert not [c for c in (await env.sandbox_state())["contacts"] if c["id"] == deleted_record]

    run_id, summary = await _trigger_and_wait(client, handle)

    row = await db.fetchrow("SELECT * FROM drift_reports WHERE run_id = $1", run_id)
    assert row is not None and row["trigger"] == "schedule"
    assert row["report_id"] == summary.report_id and summary.counts["missing"] == row["missing"]
    findings: list[dict[str, Any]] = row["findings"]
    by_subject = {f["subject"]: f for f in findings}
    assert by_subject[f"contact:{deleted_contact}"] == {
        "kind": "missing", "subject": f"contact:{deleted_contact}",
        "detail": f"missing_record:{deleted_record}", "op_key": f"{deleted_wf}:crm-upsert"}
    assert by_subject[f"contact:{changed_contact}"] == {
        "kind": "changed", "subject": f"contact:{changed_contact}",
        "detail": f"record_of_other_contact:{changed_record}",
        "op_key": f"{changed_wf}:crm-upsert"}
    assert f"contact:{intact_contact}" not in by_subject
    # The report says what it sampled: these three items' operations at least.
    assert row["sampled"] == row["completed_in_window"] >= 3
    sent = await db.fetch(
        "SELECT i.intent_id::text AS intent_id FROM followup_intents i JOIN inbound_events e"
        " USING (event_id) WHERE e.workflow_id = ANY($1::text[]) AND i.status = 'sent'",
        [deleted_wf, changed_wf, intact_wf])
    assert sent, "the inquiries got their acknowledgments"
    assert not {f"intent:{r['intent_id']}" for r in sent} & set(by_subject)  # emails intact

    # The operator's view: the latest scheduled report, and the same findings on demand.
    latest = cli(stack, "reconcile")
    assert latest.returncode == 1, latest.stderr
    assert f"contact:{deleted_contact} missing_record:{deleted_record}" in latest.stdout
    assert run_id in latest.stdout and "sampled" in latest.stdout
    now = cli(stack, "reconcile", "--since", "1h", "--sample", "10000", "--json")
    assert now.returncode == 1, now.stderr
    body = json.loads(now.stdout)
    assert body["latest_scheduled"]["run_id"] == run_id
    on_demand = {f["subject"]: f["detail"] for f in body["on_demand"]["findings"]}
    assert on_demand[f"contact:{deleted_contact}"] == f"missing_record:{deleted_record}"
    assert on_demand[f"contact:{changed_contact}"] == f"record_of_other_contact:{changed_record}"

    # The metric the alert reads is the latest *scheduled* run's.
    expected = f'inboxcrm_drift_findings{{kind="missing"}} {float(row["missing"])}'

    async def refreshed() -> str | None:  # gauges are read on an interval, not per scrape
        text = (await env.http.get(stack.relay_metrics_url)).text
        return text if expected in text else None

    metrics = await env.wait_for(refreshed, timeout=15, what="drift gauge refreshed")
    assert expected in metrics
    assert row["missing"] >= 1

    # The run's history replays against today's workflow code.
    history = await client.get_workflow_handle(run_id).fetch_history()
    replayer = Replayer(workflows=[DriftCheckWorkflow], data_converter=client.data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


async def test_a_note_and_an_email_activity_deleted_in_the_crm_are_reported(
        env: StackClient, stack: Stack, db: asyncpg.Pool) -> None:
    """What was logged on the contact is checked too: a salesperson deletes the note and the
    inbound email's activity from the timeline; the next check names each by its operation,
    and the follow-up's activity, left alone, is not named."""
    workflow_id, _, _ = await _completed_contact(env, db, "drift-note")
    ops = {r["action"]: r for r in await db.fetch(
        "SELECT op_key, action, destination_id FROM operations"
        " WHERE workflow_id = $1 AND status = 'completed'", workflow_id)}
    assert {"crm-note", "crm-email", "crm-sent"} <= set(ops), sorted(ops)
    state = await env.sandbox_state()
    held = {str(n["id"]) for n in state["activities"]}
    assert {ops[a]["destination_id"] for a in ("crm-note", "crm-email", "crm-sent")} <= held
    for action in ("crm-note", "crm-email"):
        response = await env.http.delete(
            f"{stack.sandbox_url}/_sandbox/notes/{ops[action]['destination_id']}")
        assert response.status_code == 200, response.text

    now = cli(stack, "reconcile", "--since", "10m", "--sample", "10000", "--json")
    assert now.returncode == 1, now.stderr
    findings = {f["subject"]: f for f in json.loads(now.stdout)["on_demand"]["findings"]}
    for action in ("crm-note", "crm-email"):
        op = ops[action]
        assert findings[f"logged:{op['op_key']}"] == {
            "kind": "missing", "subject": f"logged:{op['op_key']}",
            "detail": f"missing_activity:{op['destination_id']}", "op_key": op["op_key"]}
    assert f"logged:{ops['crm-sent']['op_key']}" not in findings


async def test_the_adapters_read_what_the_destination_holds_now(stack: Stack) -> None:
    """The drift check's reads: a record by its CRM ID with our external-ID property (HubSpot
    and Salesforce shapes), an email by the provider's ID; gone is None; SMTP cannot say."""
    sandbox = stack.sandbox_url
    hubspot = HubSpotCrm(sandbox, None, "inboxcrm_contact_id", 5)
    salesforce = SalesforceCrm(sandbox, None, timeout=5)
    mail = ResendMail(sandbox, None, "Acme Sales <sales@acme.test>", 5)
    smtp = SmtpMail("127.0.0.1", 9, sender="sales@acme.test", security="none")
    try:
        for crm in (hubspot, salesforce):
            contact_id = str(uuid.uuid4())
            record = await crm.upsert_contact(
                contact_id, ContactFields(unique_email("drift-read"), "Ada Byron"))
            assert await crm.read_contact(record.record_id) == CrmRecordView(
                record.record_id, contact_id)
            assert await crm.read_contact("999999999999") is None
        intent_id = str(uuid.uuid4())
        sent = await mail.send(intent_id, OutgoingEmail(unique_email("drift-read"), "Hi", "Hello"))
        assert await mail.read_sent(sent.message_id) == SentRecord(sent.message_id, intent_id)
        assert await mail.read_sent(str(uuid.uuid4())) is None
        with pytest.raises(Unverifiable):
            await smtp.read_sent(f"<{intent_id}@acme.test>")
    finally:
        for client in (hubspot, salesforce, mail, smtp):
            await client.aclose()


async def test_follow_ups_sent_over_smtp_are_reported_unverifiable_never_present(
    env: StackClient, stack: Stack, db: asyncpg.Pool,
) -> None:
    workflow_id, _, _ = await _completed_contact(env, db, "drift-smtp")
    intent_id = await db.fetchval(
        "SELECT i.intent_id::text FROM followup_intents i JOIN inbound_events e USING"
        " (event_id) WHERE e.workflow_id = $1 AND i.status = 'sent'", workflow_id)
    assert intent_id
    crm = HubSpotCrm(stack.sandbox_url, None, "inboxcrm_contact_id", 5)
    smtp = SmtpMail("127.0.0.1", 9, sender="sales@acme.test", security="none")
    now = datetime.now(UTC)
    request = DriftCheckRequest((now - timedelta(minutes=10)).isoformat(), now.isoformat(),
                                10_000, Trigger.ON_DEMAND.value)
    try:
        report = await run_drift_check(db, crm, smtp, request, run_id=f"test:{uuid.uuid4()}")
    finally:
        await crm.aclose()
    findings = {f.subject: f for f in report.findings}
    assert findings[f"intent:{intent_id}"].kind == "unverifiable"
    assert findings[f"intent:{intent_id}"].op_key == f"{workflow_id}:send"
    assert report.mail == "smtp" and report.report_id is not None


async def test_relay_gauges_show_the_latest_accepted_delivery_per_source(
    env: StackClient, stack: Stack,
) -> None:
    """What the inbound-silence alert reads: the ledger's latest accepted delivery per source
    (every relay replica reports the same; a restart does not reset it)."""
    before = datetime.now(UTC).timestamp()
    await env.deliver(message_from(unique_email("drift-gauge")))
    prefix = 'inboxcrm_last_delivery_timestamp_seconds{source="standard"}'

    async def latest() -> str | None:  # gauges are read on an interval, not per scrape
        text = (await env.http.get(stack.relay_metrics_url)).text
        line = next((line for line in text.splitlines() if line.startswith(prefix)), None)
        return text if line and float(line.rsplit(" ", 1)[1]) >= before - 1 else None

    metrics = await env.wait_for(latest, timeout=15, what="delivery gauge refreshed")
    assert "\ninboxcrm_ambiguous_matches_open " in metrics
