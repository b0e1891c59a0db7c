"""One inbound email, end to end, on real components: relay → ledger → Temporal → worker →
sandbox CRM and mail. Every assertion counts records on the destination side."""

from __future__ import annotations

import asyncio
import json
import time

from inboxcrm.verify.probe import StackClient, message_from, unique_email


async def test_happy_path_one_contact_one_record_one_email(env: StackClient) -> None:
    email = unique_email("happy")
    workflow_id = await env.deliver(message_from(email), "E-happy-" + email[6:16])

    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")
    assert await env.contacts_for(email) == 1
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1
    status = await env.query_status(workflow_id)
    assert status["state"] == "completed"
    assert {op["status"] for op in status["operations"].values()} == {"completed"}


async def test_same_delivery_five_times_concurrently(env: StackClient) -> None:
    email = unique_email("dup")
    raw = message_from(email)
    delivery_id = "E-dup-" + email[4:14]

    responses = await asyncio.gather(*(env.post(raw, delivery_id) for _ in range(5)))

    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    statuses = sorted(r.json()["status"] for r in responses)
    assert statuses == ["accepted", "duplicate", "duplicate", "duplicate", "duplicate"]
    workflow_ids = {r.json()["workflow_id"] for r in responses}
    assert workflow_ids == {f"inbound/acme/standard/sales@acme.test/{delivery_id}"}
    workflow_id = workflow_ids.pop()
    await env.wait_state(workflow_id, "completed")
    assert await env.count("SELECT count(*) FROM inbound_events WHERE delivery_id = $1",
                           delivery_id) == 1
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1

    # Redelivered after completion: answered from the ledger, nothing runs again.
    again = await env.post(raw, delivery_id)
    assert again.status_code == 200
    assert again.json() == {"status": "duplicate", "workflow_id": workflow_id,
                            "state": "completed"}
    await asyncio.sleep(1.0)
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1
    client = await env.temporal()
    runs = [w async for w in client.list_workflows(f'WorkflowId = "{workflow_id}"')]
    assert len(runs) == 1


async def test_two_deliveries_same_person_same_second(env: StackClient) -> None:
    email = unique_email("twin")
    first, second = await asyncio.gather(
        env.deliver(message_from(email, subject="Pricing"), "E-twin-a-" + email[5:15]),
        env.deliver(message_from(email, subject="Demo please"), "E-twin-b-" + email[5:15]),
    )

    await env.wait_state(first, {"completed", "suppressed"})
    await env.wait_state(second, {"completed", "suppressed"})
    assert await env.count(
        "SELECT count(*) FROM inbound_events WHERE canonical_email = lower($1)", email) == 2
    assert await env.contacts_for(email) == 1
    assert len(await env.crm_records_for(email)) == 1
    # One acknowledgment per person per quiet period, not one per message.
    assert len(await env.emails_to(email)) == 1


async def test_bad_signatures_are_rejected_and_nothing_is_stored(env: StackClient) -> None:
    email = unique_email("forged")
    raw = message_from(email)
    before = await env.count("SELECT count(*) FROM inbound_events")

    wrong_secret = "whsec_" + "d3Jvbmctc2VjcmV0LXdyb25nLXNlY3JldC13cm9uZyE="
    stale = time.time() - 3600
    cases = [
        await env.post(raw, secret=wrong_secret),
        await env.post(raw, timestamp=stale),
        await env.post(raw, headers={"webhook-signature": "v1,AAAA"}),
        await env.post(raw, headers={"webhook-signature": "garbage"}),
    ]
    unsigned = await env.http.post(f"{env.endpoints.relay_url}/v1/inbound/standard",
                                   content=b'{"tenant":"acme"}',
                                   headers={"content-type": "application/json"})
    cases.append(unsigned)

    assert [r.status_code for r in cases] == [401] * 5
    assert all(r.json()["status"] == "error" for r in cases)
    assert await env.count("SELECT count(*) FROM inbound_events") == before
    assert await env.contacts_for(email) == 0


async def test_malformed_and_oversized_bodies(env: StackClient) -> None:
    before = await env.count("SELECT count(*) FROM inbound_events")

    not_json = await env.post("", body=b"{not json")
    missing = await env.post("", body=json.dumps({"tenant": "acme"}).encode())
    wrong_type = await env.post("", body=json.dumps(
        {"tenant": "acme", "mailbox": "sales@acme.test", "delivery_id": 7, "raw": "x"}).encode())
    unknown_tenant = await env.post("x", tenant="nobody")
    foreign_mailbox = await env.post("x", mailbox="someone@else.test")
    oversized = await env.post("x" * (10 * 1024 * 1024 + 10))

    for response in (not_json, missing, wrong_type, unknown_tenant, foreign_mailbox):
        assert response.status_code == 422, response.text
        assert response.json()["message"]
    assert "delivery_id" in wrong_type.json()["message"]
    assert "raw" in missing.json()["message"] or "mailbox" in missing.json()["message"]
    assert oversized.status_code == 413
    assert await env.count("SELECT count(*) FROM inbound_events") == before


BOUNCE = """Return-Path: <>
From: Mail Delivery Subsystem <MAILER-DAEMON@mx.example.net>
To: sales@acme.test
Subject: Undelivered Mail Returned to Sender
Message-ID: <bounce-{tag}@mx.example.net>
Content-Type: multipart/report; report-type=delivery-status; boundary="b1"

--b1
Content-Type: text/plain

This is the mail system. Your message to {email} could not be delivered.
--b1
Content-Type: message/delivery-status

Final-Recipient: rfc822; {email}
Action: failed
Status: 5.1.1
--b1--
"""

AUTO_REPLY = """From: Out Of Office <{email}>
To: sales@acme.test
Subject: Automatic reply: Pricing
Auto-Submitted: auto-replied
Message-ID: <ooo-{tag}@example.com>
Content-Type: text/plain; charset=utf-8

I am out of the office until Monday.
"""


async def test_bounce_and_auto_reply_are_ignored(env: StackClient) -> None:
    bounced = unique_email("bounced")
    away = unique_email("away")
    bounce_id = await env.deliver(BOUNCE.format(email=bounced, tag=bounced[:12]))
    auto_id = await env.deliver(AUTO_REPLY.format(email=away, tag=away[:12]))

    assert (await env.wait_state(bounce_id, "ignored"))[0] == "ignored"
    assert (await env.wait_state(auto_id, "ignored"))[0] == "ignored"
    assert await env.contacts_for(bounced) == 0
    assert await env.contacts_for(away) == 0
    assert await env.crm_records_for(away) == []
    assert await env.emails_to(away) == []


async def test_more_concurrent_new_deliveries_than_pooled_connections(env: StackClient) -> None:
    """60 new deliveries at once against a pool of 20: every one is answered and stored
    (a request never holds one pooled connection while waiting for another)."""
    emails = [unique_email("burst") for _ in range(60)]

    responses = await asyncio.wait_for(
        asyncio.gather(*(env.post(message_from(e)) for e in emails)), timeout=60)

    assert sorted({r.status_code for r in responses}) == [200]
    assert {r.json()["status"] for r in responses} == {"accepted"}
    ids = [r.json()["workflow_id"] for r in responses]
    assert await env.count("SELECT count(*) FROM inbound_events WHERE workflow_id = ANY($1)",
                           ids) == 60
    # ...and processed. (Also keeps this burst from eating the faults a later test injects.)
    for workflow_id in ids:
        await env.wait_state(workflow_id, "completed")
