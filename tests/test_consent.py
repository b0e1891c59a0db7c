"""Consent from both sides (issue 35, docs/consent.md), against real components.

- A CRM-side opt-out set before the email arrives (a contact a salesperson created, opted
  out in the CRM): no follow-up reaches the sandbox, the item ends `suppressed`, and the
  audit names the CRM field. HubSpot end to end through the relay and the worker; HubSpot
  and Salesforce through the CRM and send steps against a sandbox process of their own.
- An opt-out recorded by inboxcrm (one-click unsubscribe) appears in the CRM's field, by the
  scheduled consent sync's workflow on the running stack.
- A fault on the write-back is retried and the opt-out lands once (the sandbox's call log
  and the audit count it).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr
from temporalio.testing import ActivityEnvironment

from inboxcrm.activities.consent import ConsentActivities
from inboxcrm.activities.crm import CrmActivities
from inboxcrm.activities.send import SendActivities
from inboxcrm.adapters.base import CrmClient
from inboxcrm.adapters.factory import Destinations
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.resend import ResendMail
from inboxcrm.adapters.salesforce import SalesforceCrm
from inboxcrm.ingress.unsubscribe import record_unsubscribe
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.consent import ConsentSyncInput
from inboxcrm.schemas.contract import CONSENT_SYNC_WORKFLOW_TYPE
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.outbox import planned_item, step_env
from tests.helpers.sandbox_process import API_KEY, SandboxProcess, own_sandbox

HS_PROPERTY = "inboxcrm_contact_id"
SECRET = "test-unsubscribe-secret-of-32-bytes-or-more"
ONE_CLICK_BODY = b"List-Unsubscribe=One-Click"
ONE_CLICK_HEADERS = {"content-type": "application/x-www-form-urlencoded"}


@pytest.fixture(scope="module")
async def org(postgres_server_url: str) -> AsyncIterator[SandboxProcess]:
    """A sandbox of its own (its own database: an account nobody else writes to)."""
    async for process in own_sandbox(postgres_server_url, "sandbox_consent"):
        yield process


@pytest.fixture
async def control(org: SandboxProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=org.url, timeout=10) as client:
        (await client.post("/_sandbox/reset")).raise_for_status()
        yield client


def _crm(org: SandboxProcess, provider: str) -> CrmClient:
    if provider == "hubspot":
        return HubSpotCrm(org.url, API_KEY, HS_PROPERTY, 10)
    return SalesforceCrm(org.url, API_KEY)


def _audit_cli(stack: Stack, *args: str) -> str:
    """`inboxcrm audit …` as an operator runs it: the story in sentences."""
    done = subprocess.run([sys.executable, "-m", "inboxcrm.cli", "audit", *args],
                          env=stack.env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _detail(raw: Any) -> dict[str, Any]:
    return raw if isinstance(raw, dict) else dict(json.loads(raw))


async def _audit(pool: asyncpg.Pool, action: str, *, workflow_id: str | None = None,
                 contact_id: str | None = None) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        "SELECT detail FROM audit_log WHERE action = $1 AND (workflow_id = $2 OR "
        "contact_id = $3::uuid) ORDER BY audit_id", action, workflow_id, contact_id)
    return [_detail(r["detail"]) for r in rows]


async def _held(control: httpx.AsyncClient, email: str) -> list[dict[str, Any]]:
    contacts = (await control.get("/_sandbox/state")).json()["contacts"]
    return [c for c in contacts if str(c["properties"].get("email", "")).lower() == email]


# --- a CRM-side opt-out stops the follow-up -----------------------------------------------


async def test_hubspot_opt_out_set_before_the_email_arrives_stops_the_follow_up(
        env: StackClient, stack: Stack) -> None:
    """End to end: the relay, the workflow, the worker's CRM and send steps, the sandbox."""
    email = unique_email("crmoptout")
    seeded = await env.http.post(f"{stack.sandbox_url}/_sandbox/seed", json={
        "crm": "hubspot", "contacts": [{"email": email, "lastname": "Seeded", "owner": "7001",
                                        "opted_out": True}]})
    seeded.raise_for_status()
    [record] = seeded.json()["contacts"]
    state = (await env.http.get(f"{stack.sandbox_url}/_sandbox/state")).json()
    [held] = [c for c in state["contacts"] if c["id"] == record["id"]]
    assert held["properties"]["hs_email_optout"] == "true"

    workflow_id = await env.deliver(message_from(email))
    assert await env.wait_state(workflow_id, {"completed", "suppressed"}, timeout=120) == (
        "suppressed", "crm_opt_out")
    assert await env.emails_to(email) == []
    [refused] = await _audit(env.db, "eligibility_checked", workflow_id=workflow_id)
    assert refused["eligible"] is False and refused["reason"] == "crm_opt_out"
    assert refused["crm_field"] == "hs_email_optout"
    assert refused["consent"]["crm_record_id"] == record["id"]
    assert refused["consent"]["lawful_basis"] == "reply_to_inquiry"
    story = _audit_cli(stack, "--workflow", workflow_id)
    assert "NOT eligible (crm_opt_out): the CRM's hs_email_optout says opted out" in story
    assert "consent record: lawful basis reply_to_inquiry (service)" in story
    # Nothing of ours was written onto the CRM's opt-out (it came from the CRM).
    assert await env.count("SELECT count(*) FROM crm_consent_writes w JOIN contacts c ON "
                           "(c.tenant, c.canonical_email) = (w.tenant, w.canonical_email) "
                           "WHERE c.email = $1", email) == 0


@pytest.mark.parametrize("provider", ["hubspot", "salesforce"])
async def test_crm_opt_out_stops_the_send_step_and_names_the_field(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        provider: str) -> None:
    item = await planned_item(store)
    [seeded] = (await control.post("/_sandbox/seed", json={
        "crm": provider, "contacts": [{"email": item.email, "lastname": "Seeded",
                                       "opted_out": False}]})).json()["contacts"]
    crm = _crm(org, provider)
    mail = ResendMail(org.url, API_KEY, "Acme Sales <sales@acme.test>", 10)
    field = "hs_email_optout" if provider == "hubspot" else "HasOptedOutOfEmail"
    try:
        upserted = await step_env().run(CrmActivities(store, crm, 300).upsert_contact_in_crm,
                                        item.op("crm-upsert"))
        assert upserted.destination_id == seeded["id"]
        # The salesperson opts the person out in the CRM after we adopted the record.
        if provider == "salesforce":
            (await control.patch(f"/services/data/v62.0/sobjects/Contact/{seeded['id']}",
                                 json={"HasOptedOutOfEmail": True},
                                 headers={"Authorization": f"Bearer {API_KEY}"})
             ).raise_for_status()
        else:
            refused = await control.patch(f"/crm/v3/objects/contacts/{seeded['id']}",
                                          json={"properties": {field: "true"}},
                                          headers={"Authorization": f"Bearer {API_KEY}"})
            assert refused.status_code == 400  # read-only in HubSpot, as in the sandbox
            (await control.post(
                f"/communication-preferences/v4/statuses/{item.email}/unsubscribe-all",
                params={"channel": "EMAIL"}, headers={"Authorization": f"Bearer {API_KEY}"})
             ).raise_for_status()
        send = SendActivities(store, Destinations.fixed(crm=crm, mail=mail), 300)
        result = await step_env().run(send.submit_followup_email, item.op("send"))
    finally:
        await crm.aclose()
        await mail.aclose()
    assert (result.status, result.reason) == ("cancelled", "crm_opt_out")
    assert (await control.get("/_sandbox/state")).json()["emails"] == []
    [checked] = await _audit(store, "eligibility_checked", workflow_id=item.item.workflow_id)
    assert checked["crm_field"] == field and checked["consent"]["crm_opted_out"] is True
    assert await store.fetchval("SELECT cancel_reason FROM followup_intents WHERE "
                                "intent_id = $1::uuid", item.intent_id) == "crm_opt_out"


# --- inboxcrm's own opt-outs reach the CRM ------------------------------------------------


async def test_one_click_unsubscribe_appears_in_the_crm_field(
        env: StackClient, stack: Stack, app_settings: Settings) -> None:
    email = unique_email("unsubcrm")
    workflow_id = await env.deliver(message_from(email))
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")
    [sent] = await env.emails_to(email)
    headers = (await env.http.get(f"{stack.sandbox_url}/emails/{sent['id']}")).json()["headers"]
    match = re.fullmatch(r"<(https?://[^>]+)>", headers["List-Unsubscribe"])
    assert match is not None
    assert (await env.http.post(match.group(1), content=ONE_CLICK_BODY,
                                headers=ONE_CLICK_HEADERS)).status_code == 200

    [write] = await env.db.fetch(
        "SELECT w.op_key, w.scope FROM crm_consent_writes w JOIN contacts c ON "
        "(c.tenant, c.canonical_email) = (w.tenant, w.canonical_email) WHERE c.email = $1",
        email)
    assert write["op_key"].startswith("consent/acme/") and write["op_key"].endswith(
        ":crm-opt-out") and email not in write["op_key"]
    # The schedule runs it too; a run started now does not wait for the interval.
    client = await env.temporal()
    await client.execute_workflow(CONSENT_SYNC_WORKFLOW_TYPE, ConsentSyncInput(tenant="acme"),
                                  id=f"test-consent-sync/{uuid.uuid4().hex}",
                                  task_queue=app_settings.task_queue)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        state = (await env.http.get(f"{stack.sandbox_url}/_sandbox/state")).json()
        props = [c["properties"] for c in state["contacts"]
                 if str(c["properties"].get("email", "")).lower() == email]
        if props and props[0].get("hs_email_optout") == "true":
            break
        await asyncio.sleep(1)
    assert len(props) == 1 and props[0].get("hs_email_optout") == "true"
    status = await env.db.fetchval("SELECT status FROM crm_consent_writes WHERE op_key = $1",
                                   write["op_key"])
    assert status == "completed"
    written = [d for d in await _audit(env.db, "crm_opt_out_written",
                                       contact_id=props[0][HS_PROPERTY])
               if d["op_key"] == write["op_key"]]
    assert len(written) == 1 and written[0]["crm_field"] == "hs_email_optout"
    story = _audit_cli(stack, "--email", email)
    assert "opt-out recorded (list_unsubscribe, scope all)" in story
    assert "opt-out written to CRM (hubspot) hs_email_optout" in story


@pytest.mark.parametrize("provider", ["hubspot", "salesforce"])
async def test_a_fault_on_the_write_back_is_retried_and_lands_once(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool,
        provider: str) -> None:
    tenant = f"consent{uuid.uuid4().hex[:8]}"
    item = await planned_item(store, tenant=tenant)
    [seeded] = (await control.post("/_sandbox/seed", json={
        "crm": provider, "contacts": [{"email": item.email, "lastname": "Seeded"}]})
    ).json()["contacts"]
    await store.execute("UPDATE contacts SET crm_record_id = $1 WHERE contact_id = $2::uuid",
                        seeded["id"], item.contact_id)
    outcome = await record_unsubscribe(store, tenant, uuid.UUID(item.contact_id))
    assert outcome is not None and outcome["changed"]
    target = "crm.consent" if provider == "hubspot" else "crm.update"
    (await control.post("/_sandbox/faults", json={"target": target, "mode": "server_error",
                                                  "count": 1})).raise_for_status()
    crm = _crm(org, provider)
    sync = ConsentActivities(store, Destinations.fixed(crm=crm))
    try:
        first = await ActivityEnvironment().run(sync.sync_consent_writes,
                                                ConsentSyncInput(tenant=tenant))
        assert (first.written, first.failed, first.blocked) == (0, 1, 0)
        row = await store.fetchrow("SELECT status, attempts, last_error_category FROM "
                                   "crm_consent_writes WHERE tenant = $1", tenant)
        assert row is not None
        assert (row["status"], row["attempts"]) == ("pending", 1)
        # Not due before its backoff: a run now writes nothing.
        early = await ActivityEnvironment().run(sync.sync_consent_writes,
                                                ConsentSyncInput(tenant=tenant))
        assert (early.written, early.failed) == (0, 0)
        await store.execute("UPDATE crm_consent_writes SET next_attempt_at = now() "
                            "WHERE tenant = $1", tenant)
        second = await ActivityEnvironment().run(sync.sync_consent_writes,
                                                 ConsentSyncInput(tenant=tenant))
        assert second.written == 1
        again = await ActivityEnvironment().run(sync.sync_consent_writes,
                                                ConsentSyncInput(tenant=tenant))
        assert again.written == 0  # completed: never written again
    finally:
        await crm.aclose()
    [held] = await _held(control, item.email)
    field = "hs_email_optout" if provider == "hubspot" else "HasOptedOutOfEmail"
    assert held["properties"][field] == "true"
    calls = (await control.get("/_sandbox/calls", params={"target": target})).json()["calls"]
    assert [c["status_code"] for c in calls] == [500, 200 if provider == "hubspot" else 204]
    assert len(await _audit(store, "crm_opt_out_failed", contact_id=item.contact_id)) == 1
    [written] = await _audit(store, "crm_opt_out_written", contact_id=item.contact_id)
    assert written["crm_field"] == field and written["crm_record_ids"] == [seeded["id"]]
    assert written["attempt"] == 2


async def test_a_failed_opt_out_read_never_sends_and_the_retry_does(
        org: SandboxProcess, control: httpx.AsyncClient, store: asyncpg.Pool) -> None:
    """The CRM cannot be asked: the attempt fails (transient, nothing sent) rather than
    assume consent; the next attempt reads it and sends once."""
    item = await planned_item(store)
    crm = _crm(org, "hubspot")
    mail = ResendMail(org.url, API_KEY, "Acme Sales <sales@acme.test>", 10)
    send = SendActivities(store, Destinations.fixed(crm=crm, mail=mail), 300,
                          Settings(unsubscribe_secret=SecretStr(SECRET),
                                   public_relay_url="https://relay.example"))
    try:
        await step_env().run(CrmActivities(store, crm, 300).upsert_contact_in_crm,
                             item.op("crm-upsert"))
        (await control.post("/_sandbox/faults", json={"target": "crm.search",
                                                      "mode": "server_error", "count": 1})
         ).raise_for_status()
        with pytest.raises(Exception, match="consent_read"):
            await step_env().run(send.submit_followup_email, item.op("send"))
        assert (await control.get("/_sandbox/state")).json()["emails"] == []
        row = await store.fetchrow("SELECT status, last_error_category, last_error FROM "
                                   "operations WHERE op_key = $1", item.op("send").op_key)
        assert row is not None and row["last_error_category"] == "transient"
        result = await step_env().run(send.submit_followup_email, item.op("send"))
    finally:
        await crm.aclose()
        await mail.aclose()
    assert result.status == "completed"
    emails = (await control.get("/_sandbox/state")).json()["emails"]
    assert [e["to"] for e in emails] == [[item.email]]
    checked = await _audit(store, "eligibility_checked", workflow_id=item.item.workflow_id)
    assert [c["eligible"] for c in checked] == [True]
    assert checked[0]["consent"]["crm_field"] == "hs_email_optout"
    assert checked[0]["consent"]["crm_opted_out"] is False
