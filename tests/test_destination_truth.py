"""Reconciliation that holds on the real services' contracts (docs/architecture.md §4),
with real sandbox faults and the sandbox clock, counted on the destination side:

- Resend has no lookup by key: inside the key's 24 h window the identical request with the
  same key is the reconciliation; past it the item is held (`ambiguous`), never guessed;
- a HubSpot note carries hs_timestamp and is associated by the v4 call, both under the note's
  one operation key; repeating creates nothing;
- HubSpot's DAILY 429 parks the tenant's CRM scope until the reset, spending no attempt;
  so does a Retry-After longer than a step waits in place (an hour here), and
  `inboxcrm resume` lifts such a park.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import cli

SEND_KEY = "{}:send"
MESSAGE_DATE = "2026-11-29T10:00:00.000Z"  # the Date header of the sample message


async def send_unrelated_email(env: StackClient) -> str:
    """Someone else's email, the newest of the account: what a list-and-guess would take."""
    response = await env.http.post(
        f"{env.endpoints.sandbox_url}/emails", headers={"Idempotency-Key": str(uuid.uuid4())},
        json={"from": "Other <other@acme.test>", "to": ["someone.else@example.com"],
              "subject": "Unrelated", "text": "x"})
    response.raise_for_status()
    return str(response.json()["id"])


async def intent_of(env: StackClient, workflow_id: str) -> Any:
    return await env.db.fetchrow(
        "SELECT i.intent_id::text, i.status, i.provider_message_id FROM followup_intents i "
        "JOIN inbound_events e ON e.event_id = i.event_id WHERE e.workflow_id = $1",
        workflow_id)


async def test_an_unrelated_email_is_never_taken_for_an_unconfirmed_one(
        env: StackClient) -> None:
    """The first attempt's outcome is unknown; the newest email of the account is someone
    else's. The intent is recorded with its own email (found by repeating with its key)."""
    email = unique_email("unrelated")
    unrelated = await send_unrelated_email(env)
    await env.inject("mail.send", "timeout_before_commit")
    workflow_id = await env.deliver(message_from(email))

    await env.wait_state(workflow_id, "completed", timeout=90)

    [mine] = await env.emails_to(email)
    intent = await intent_of(env, workflow_id)
    assert mine["idempotency_key"] == intent["intent_id"]
    assert intent["provider_message_id"] == mine["id"] != unrelated
    op = await env.operation(SEND_KEY.format(workflow_id))
    assert op["attempts"] >= 2 and op["destination_id"] == mine["id"]


async def test_unknown_outcome_inside_the_window_is_one_email(env: StackClient) -> None:
    email = unique_email("inwindow")
    await env.inject("mail.send", "timeout_after_commit")
    workflow_id = await env.deliver(message_from(email))

    await env.wait_state(workflow_id, "completed", timeout=90)

    [sent] = await env.emails_to(email)
    op = await env.operation(SEND_KEY.format(workflow_id))
    assert op["attempts"] >= 2 and op["first_attempt_at"] is not None
    assert (await intent_of(env, workflow_id))["provider_message_id"] == sent["id"]


async def _held_calls(env: StackClient) -> int:
    return sum(c["outcome"] == "hold_before_commit" for c in await env.calls("mail.send"))


@pytest.mark.parametrize(("first", "emails"), [
    ("timeout_after_commit", 1),    # the provider took it; a repeat now would send again
    ("timeout_before_commit", 0),   # nothing was sent; still nothing can confirm that
])
async def test_past_the_window_the_item_is_held_and_nothing_more_is_sent(
        env: StackClient, first: str, emails: int) -> None:
    email = unique_email("pastwindow")
    held_before = await _held_calls(env)
    await env.inject("mail.send", first)
    # The second attempt is held on the wire (past its window check) until released.
    await env.inject("mail.send", "hold_before_commit")
    workflow_id = await env.deliver(message_from(email))
    op_key = SEND_KEY.format(workflow_id)

    async def second_attempt_held() -> bool:
        return await _held_calls(env) > held_before

    await env.wait_for(second_attempt_held, timeout=60,
                       what="the second send attempt held on the wire")
    # A day passes on both sides while it is held: the ledger's first attempt (whose outcome
    # is unknown, so the key's window runs from it) and the provider's key. Only while no
    # third attempt is claimed (a claim reads the window in the statement that counts it),
    # so the next attempt is the first to see the window passed.
    moved = await env.db.execute(
        "UPDATE operations SET first_attempt_at = first_attempt_at - interval '25 hours', "
        "key_window_from = key_window_from - interval '25 hours' "
        "WHERE op_key = $1 AND attempts = 2", op_key)
    assert moved == "UPDATE 1"
    await env.move_sandbox_clock(advance_seconds=25 * 3600)
    # The held attempt is answered (a 504, nothing sent); no fault is left for later ones.
    await env.http.delete(f"{env.endpoints.sandbox_url}/_sandbox/faults")

    state, reason = await env.wait_state(workflow_id, "ambiguous", timeout=90)

    assert reason == "outcome_unconfirmed"
    assert len(await env.emails_to(email)) == emails
    op = await env.operation(op_key)
    intent = await intent_of(env, workflow_id)
    assert (op["status"], op["last_error"]) == ("ambiguous", "idempotency_window_passed")
    assert op["external_ref"] == intent["intent_id"] and intent["status"] != "sent"
    detail = await env.db.fetchval(
        "SELECT detail FROM audit_log WHERE workflow_id = $1 AND action = 'operation_ambiguous'",
        workflow_id)
    detail = json.loads(detail) if isinstance(detail, str) else detail
    assert detail["external_ref"] == intent["intent_id"]
    assert datetime.fromisoformat(detail["first_attempt_at"]) == op["first_attempt_at"]
    assert datetime.fromisoformat(detail["key_window_from"]) == op["key_window_from"]


async def test_a_send_refused_before_a_long_pause_is_sent_after_it(env: StackClient) -> None:
    """The first attempt is refused with a 429: the provider took nothing, so no key window
    opens. A day passes before the next attempt (past Resend's 24 h): that attempt repeats
    nothing that may have been sent, so it sends, once; the item is not held `ambiguous`."""
    email = unique_email("refusedthenday")
    await env.inject("mail.send", "rate_limit", retry_after=15)
    workflow_id = await env.deliver(message_from(email))
    op_key = SEND_KEY.format(workflow_id)

    async def refused() -> Any:
        op = await env.operation(op_key)
        return op if op is not None and (op["attempts"], op["status"]) == (1, "waiting") \
            else None

    op = await env.wait_for(refused, timeout=60, what="the first send attempt refused")
    assert (op["last_error_category"], op["last_error"]) == (
        "transient", "http_429:rate_limit_exceeded")
    assert op["first_attempt_at"] is not None and op["key_window_from"] is None
    # A day passes on both sides before the second attempt (due 15 s after the first).
    await env.db.execute("UPDATE operations SET first_attempt_at = first_attempt_at - "
                         "interval '25 hours' WHERE op_key = $1", op_key)
    await env.move_sandbox_clock(advance_seconds=25 * 3600)

    await env.wait_state(workflow_id, "completed", timeout=60)

    [sent] = await env.emails_to(email)
    op = await env.operation(op_key)
    assert (op["status"], op["attempts"], op["destination_id"]) == ("completed", 2, sent["id"])
    assert (await intent_of(env, workflow_id))["provider_message_id"] == sent["id"]


async def test_note_has_the_message_date_and_the_v4_association_once(
        env: StackClient) -> None:
    """The association call times out after it took effect: the next attempt reads the note
    by its unique property and re-asserts the association; nothing is created twice, and
    repeating the whole note call afterwards changes nothing."""
    email = unique_email("notedv4")
    await env.inject("crm.association", "timeout_after_commit")
    notes_before = len(await env.calls("crm.note"))
    workflow_id = await env.deliver(message_from(email))

    await env.wait_state(workflow_id, "completed", timeout=90)

    [record] = await env.crm_records_for(email)
    mine = [n for n in (await env.sandbox_state())["notes"]
            if record["id"] in n["associations"]["contacts"]]
    assert len(mine) == 1 and mine[0]["associations"]["contacts"] == [record["id"]]
    assert mine[0]["properties"]["hs_timestamp"] == MESSAGE_DATE
    assert len(await env.calls("crm.note")) - notes_before == 1  # found, not upserted again
    op = await env.operation(f"{workflow_id}:crm-note")
    assert (op["status"], op["destination_id"]) == ("completed", mine[0]["id"])

    key = mine[0]["properties"]["inboxcrm_note_id"]
    crm = HubSpotCrm(env.endpoints.sandbox_url, None, "inboxcrm_contact_id", 10.0)
    try:
        again = await crm.log_note(key, record["id"], "Inbound email.", datetime.now(UTC))
    finally:
        await crm.aclose()
    assert again == mine[0]["id"]
    after = [n for n in (await env.sandbox_state())["notes"]
             if record["id"] in n["associations"]["contacts"]]
    assert [(n["id"], n["associations"]["contacts"]) for n in after] == [
        (mine[0]["id"], [record["id"]])]


async def test_daily_limit_parks_the_crm_scope_until_the_reset(env: StackClient) -> None:
    email = unique_email("dailylimit")
    await env.inject("crm.upsert", "rate_limit", policy="DAILY")
    workflow_id = await env.deliver(message_from(email))
    op_key = f"{workflow_id}:crm-upsert"
    try:
        parked = await env.wait_for(lambda: env.db.fetchval(
            "SELECT value FROM settings WHERE tenant = 'acme' AND key = 'parked.crm'"),
            what="the CRM scope parked")
        parked = json.loads(parked) if isinstance(parked, str) else parked
        until = datetime.fromisoformat(parked["until"])
        assert (until.hour, until.minute) == (0, 5) and until > datetime.now(UTC)
        await env.wait_state(workflow_id, "crm_pending")
        op = await env.operation(op_key)
        assert (op["status"], op["attempts"], op["last_error"]) == (
            "waiting", 0, "http_429:DAILY")  # the budget is untouched
        calls_while_parked = len(await env.calls("crm.upsert"))
        await env.wait_for(lambda: env.db.fetchval(
            "SELECT reason = 'paused' FROM inbound_events WHERE workflow_id = $1",
            workflow_id), what="the item shown as paused")
        assert len(await env.calls("crm.upsert")) == calls_while_parked  # nothing is tried

        # The reset comes: the next poll goes on, with its first attempt.
        await env.db.execute(
            "UPDATE settings SET value = jsonb_set(value, '{until}', to_jsonb(now()::text)) "
            "WHERE tenant = 'acme' AND key = 'parked.crm'")
        await env.wait_state(workflow_id, "completed", timeout=120)
    finally:
        await env.db.execute("DELETE FROM settings WHERE tenant = 'acme' AND key = 'parked.crm'")
    assert len(await env.crm_records_for(email)) == 1
    op = await env.operation(op_key)
    assert (op["status"], op["attempts"]) == ("completed", 1)


async def test_a_retry_after_of_an_hour_parks_without_spending_an_attempt(
        env: StackClient, stack: Stack) -> None:
    """HubSpot answers 429 with `Retry-After: 3600`: the CRM scope parks for the hour (not
    300 s of retrying that spends the budget), the attempt is given back, nothing is called
    while parked; `inboxcrm resume` lifts the park and the item completes with one record."""
    email = unique_email("retryhour")
    await env.inject("crm.upsert", "rate_limit", retry_after=3600)
    workflow_id = await env.deliver(message_from(email))
    op_key = f"{workflow_id}:crm-upsert"
    try:
        parked = await env.wait_for(lambda: env.db.fetchval(
            "SELECT value FROM settings WHERE tenant = 'acme' AND key = 'parked.crm'"),
            what="the CRM scope parked")
        parked = json.loads(parked) if isinstance(parked, str) else parked
        left = datetime.fromisoformat(parked["until"]) - datetime.now(UTC)
        assert timedelta(minutes=58) < left <= timedelta(hours=1), left
        await env.wait_for(lambda: env.db.fetchval(
            "SELECT reason = 'paused' FROM inbound_events WHERE workflow_id = $1",
            workflow_id), what="the item shown as paused")
        op = await env.operation(op_key)
        assert (op["status"], op["attempts"], op["last_error"]) == (
            "waiting", 0, "http_429:SECONDLY")  # the budget is untouched
        calls_while_parked = len(await env.calls("crm.upsert"))
        await asyncio.sleep(6)  # past the first re-check (5 s): it finds the park, calls nothing
        assert len(await env.calls("crm.upsert")) == calls_while_parked
        assert (await env.operation(op_key))["attempts"] == 0

        resumed = cli(stack, "resume", "--tenant", "acme", "--scope", "crm")
        assert resumed.returncode == 0 and "woke" in resumed.stdout, resumed.stderr
        await env.wait_state(workflow_id, "completed", timeout=30)
    finally:
        await env.db.execute("DELETE FROM settings WHERE tenant = 'acme' AND key = 'parked.crm'")
    assert len(await env.crm_records_for(email)) == 1
    op = await env.operation(op_key)
    assert (op["status"], op["attempts"]) == ("completed", 1)


async def test_resend_list_is_not_a_lookup(env: StackClient) -> None:
    """What the removed list-and-guess would have seen: `?idempotency_key=` filters nothing."""
    unrelated = await send_unrelated_email(env)
    async with httpx.AsyncClient() as http:
        listed = (await http.get(f"{env.endpoints.sandbox_url}/emails",
                                 params={"idempotency_key": str(uuid.uuid4()),
                                         "limit": 100})).json()
        everything = (await http.get(f"{env.endpoints.sandbox_url}/emails",
                                     params={"limit": 100})).json()
    # (Not `limit=1`: a test that moved the sandbox clock forward left newer emails behind.)
    assert [e["id"] for e in listed["data"]] == [e["id"] for e in everything["data"]]
    assert unrelated in [e["id"] for e in listed["data"]]
