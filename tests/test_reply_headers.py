"""What the answer to a message takes from its headers: the CRM note's time (its Date) and
the follow-up's language (Content-Language, Accept-Language). Extraction reads them once, in
its work pool, and stores them (migration 041); an item extracted before that migration has
them read from the head of its message, as before. Both counted at the destination, as is
the note's body: the sender's delivery ID in it shows as text, never as HTML."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import cli

GERMAN_SUBJECT = "Danke für Ihre Nachricht"  # policies/acme/templates/ack.de.subject
WRITTEN = "Date: Mon, 30 Nov 2026 08:15:00 +0100\r\n"
WRITTEN_AT = "2026-11-30T07:15:00.000Z"


@pytest.fixture
def resumed(stack: Stack) -> Iterator[None]:
    yield
    cli(stack, "resume", "--tenant", "acme", "--scope", "all")


async def _note_of(env: StackClient, email: str) -> dict[str, Any]:
    [record] = await env.crm_records_for(email)
    [note] = [n for n in (await env.sandbox_state())["notes"]
              if record["id"] in n["associations"]["contacts"]]
    return dict(note)


async def test_extraction_stores_the_date_and_languages_the_answer_uses(
        env: StackClient) -> None:
    email = unique_email("deutsch")
    workflow_id = await env.deliver(message_from(
        email, extra_headers=WRITTEN + "Content-Language: de\r\n"))
    await env.wait_state(workflow_id, "completed")

    stored = await env.db.fetchrow(
        "SELECT languages, to_char(written_at AT TIME ZONE 'UTC', "
        "'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS written FROM inbound_events "
        "WHERE workflow_id = $1", workflow_id)
    assert (stored["languages"], stored["written"]) == (["de"], WRITTEN_AT)
    [sent] = await env.emails_to(email)
    assert sent["subject"] == GERMAN_SUBJECT
    assert (await _note_of(env, email))["properties"]["hs_timestamp"] == WRITTEN_AT


async def test_an_item_extracted_before_041_reads_them_from_its_message(
        env: StackClient, stack: Stack, resumed: None) -> None:
    """Paused after extraction, the item's stored values are cleared as a worker before 041
    left them: the note and the send read the head of the message instead."""
    email = unique_email("vorher")
    assert cli(stack, "pause", "--tenant", "acme", "--scope", "all").returncode == 0
    workflow_id = await env.deliver(message_from(
        email, extra_headers=WRITTEN + "Accept-Language: fr;q=0.2, de\r\n"))
    await env.wait_state(workflow_id, "crm_pending")
    assert await env.db.fetchval(
        "SELECT languages FROM inbound_events WHERE workflow_id = $1", workflow_id) == [
        "de", "fr"]
    await env.db.execute("UPDATE inbound_events SET languages = NULL, written_at = NULL "
                         "WHERE workflow_id = $1", workflow_id)
    assert cli(stack, "resume", "--tenant", "acme", "--scope", "all").returncode == 0

    await env.wait_state(workflow_id, "completed")
    [sent] = await env.emails_to(email)
    assert sent["subject"] == GERMAN_SUBJECT
    assert (await _note_of(env, email))["properties"]["hs_timestamp"] == WRITTEN_AT
    assert await env.db.fetchval(
        "SELECT languages FROM inbound_events WHERE workflow_id = $1", workflow_id) is None


async def test_a_delivery_id_with_markup_reaches_the_note_as_text(env: StackClient) -> None:
    """HubSpot renders a note's body as HTML and the delivery ID is the sender's (Mailgun's
    Message-Id): markup in it is escaped, never rendered."""
    email = unique_email("markup")
    delivery = f"<img/src=x/onerror=alert(1)>{uuid.uuid4().hex}"
    workflow_id = await env.deliver(message_from(email), delivery)
    await env.wait_state(workflow_id, "completed")
    body = (await _note_of(env, email))["properties"]["hs_note_body"]
    assert "<img" not in body
    assert f"&lt;img/src=x/onerror=alert(1)&gt;{delivery[-32:]}" in body
