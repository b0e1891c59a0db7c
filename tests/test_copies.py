"""Copies and forwards are a decision, not an accident (issue 34), on the running stack.

- the same message (Message-ID and content hash) arriving by two sources of one tenant (a
  Standard Webhooks delivery and a Postmark route; a webhook and the IMAP watcher of two
  folders) is one item: each further delivery is a row of `inbound_copies` with its
  `copy_recorded` audit entry, answered as a redelivery of the first item, and the
  destination has one contact, one note and one follow-up;
- a colleague's forward from the tenant's own domain goes to review with the original
  sender as the candidate, and nothing reaches the CRM or the mail provider.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from inboxcrm.schemas.models import inbound_workflow_id
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers import dovecot as dovecot_helper
from tests.helpers.cli import cli
from tests.helpers.dovecot import Dovecot
from tests.test_mailbox_imap import ADDRESS, PASSWORD, USER, Mailbox

FIXTURES = Path(__file__).parent / "fixtures"


def crlf(raw: str) -> str:
    """Line ends as IMAP serves them, so every source hands over the same bytes."""
    return raw.replace("\r\n", "\n").replace("\n", "\r\n")


async def post_postmark(env: StackClient, stack: Stack, raw: str,
                        message_id: str) -> dict[str, Any]:
    payload = json.loads((FIXTURES / "postmark_inbound_raw_email.json").read_text())
    payload["RawEmail"], payload["MessageID"] = raw, message_id
    response = await env.http.post(
        f"{stack.relay_url}/v1/inbound/postmark", json=payload,
        auth=(stack.env["INBOXCRM_POSTMARK_USER"], stack.env["INBOXCRM_POSTMARK_PASSWORD"]))
    assert response.status_code == 200, response.text
    return dict(response.json())


async def copies_of(db: asyncpg.Pool, workflow_id: str) -> list[asyncpg.Record]:
    return list(await db.fetch(
        "SELECT c.source, c.mailbox, c.delivery_id FROM inbound_copies c"
        " JOIN inbound_events e ON e.event_id = c.event_id WHERE e.workflow_id = $1"
        " ORDER BY c.copy_row", workflow_id))


async def assert_one_of_everything(env: StackClient, db: asyncpg.Pool, email: str,
                                   message_id: str) -> None:
    """One item of the message; one contact, one note and one follow-up at the destination."""
    assert await env.count("SELECT count(*) FROM inbound_events WHERE tenant = 'acme'"
                           " AND message_id = $1", message_id) == 1
    records = await env.crm_records_for(email)
    assert len(records) == 1, records
    notes = [n for n in (await env.sandbox_state())["notes"]
             if records[0]["id"] in n["associations"].get("contacts", [])]
    assert len(notes) == 1, notes
    assert len(await env.emails_to(email)) == 1


async def test_a_webhook_and_a_postmark_copy_are_one_item(
        env: StackClient, db: asyncpg.Pool, stack: Stack) -> None:
    email = unique_email("copy")
    message_id = f"<{uuid.uuid4().hex}@initech.example>"
    raw = crlf(message_from(email).replace("Message-ID: <", "X-Was: <", 1)
               .replace("\r\nDate:", f"\r\nMessage-ID: {message_id}\r\nDate:", 1))
    workflow_id = await env.deliver(raw)
    await env.wait_state(workflow_id, "completed")

    # The same message by a second source: answered as a redelivery of the first item.
    postmark_id = str(uuid.uuid4())
    answer = await post_postmark(env, stack, raw, postmark_id)
    assert answer == {"status": "copy", "workflow_id": workflow_id, "state": "completed"}
    # The provider retries that delivery: still one copy, recorded once.
    assert await post_postmark(env, stack, raw, postmark_id) == answer

    copies = await copies_of(db, workflow_id)
    assert [(c["source"], c["mailbox"], c["delivery_id"]) for c in copies] == [
        ("postmark", "sales@acme.test", postmark_id)]
    assert await env.count(
        "SELECT count(*) FROM audit_log WHERE workflow_id = $1 AND action = 'copy_recorded'",
        workflow_id) == 1
    await assert_one_of_everything(env, db, email, message_id)

    done = cli(stack, "status", workflow_id, "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["copies"]["count"] == 1 and status["copies"]["sources"] == ["postmark"]
    assert status["copies"]["deliveries"][0]["delivery_id"] == postmark_id
    story = cli(stack, "audit", "--workflow", workflow_id)
    assert story.returncode == 0, story.stderr
    assert "recorded as a copy of this item" in story.stdout
    # The copy's own workflow ID (never started) shows the item it is a copy of.
    copy_workflow = inbound_workflow_id("acme", "postmark", "sales@acme.test", postmark_id)
    assert status["copies"]["deliveries"][0]["workflow_id"] == copy_workflow
    shown = json.loads(cli(stack, "status", copy_workflow).stdout)
    assert shown["workflow_id"] == workflow_id and shown["copy"]["source"] == "postmark"

    # Different bytes under the same Message-ID are not a copy: a message of its own.
    edited = raw.replace("20 seats", "25 seats")
    other = await env.deliver(edited)
    assert other != workflow_id
    await env.wait_state(other, {"completed", "awaiting_review"})
    assert len(await copies_of(db, workflow_id)) == 1


async def test_copies_arriving_at_once_make_one_item(
        env: StackClient, db: asyncpg.Pool) -> None:
    """Six deliveries of one message under six delivery IDs, posted at the same moment:
    the lock per (tenant, Message-ID) lets exactly one become the item."""
    email = unique_email("copyrace")
    message_id = f"<{uuid.uuid4().hex}@initech.example>"
    raw = crlf(message_from(email).replace("Message-ID: <", "X-Was: <", 1)
               .replace("\r\nDate:", f"\r\nMessage-ID: {message_id}\r\nDate:", 1))
    responses = await asyncio.gather(*(env.post(raw, f"race-{n}-{uuid.uuid4().hex[:8]}")
                                       for n in range(6)))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    statuses = sorted(r.json()["status"] for r in responses)
    assert statuses == ["accepted"] + ["copy"] * 5
    workflow_ids = {r.json()["workflow_id"] for r in responses}
    assert len(workflow_ids) == 1
    workflow_id = workflow_ids.pop()
    await env.wait_state(workflow_id, "completed")
    assert len(await copies_of(db, workflow_id)) == 5
    await assert_one_of_everything(env, db, email, message_id)


async def test_a_colleagues_forward_goes_to_review_with_the_original_sender(
        env: StackClient, db: asyncpg.Pool) -> None:
    original = unique_email("forwarded")
    colleague = f"bob.{uuid.uuid4().hex[:8]}@acme.test"
    body = ("Can someone from sales pick this up?\n\nBob\n\n"
            "---------- Forwarded message ---------\n"
            f"From: Jane Roe <{original}>\n"
            "Date: Tue, Dec 1, 2026 at 4:02 PM\n"
            "Subject: Pricing for 20 seats\n"
            f"To: Bob <{colleague}>\n\n\n"
            "Hi Bob,\n\ncould you send me pricing for 20 seats?\n\nThanks,\nJane Roe\n")
    raw = message_from(colleague, name="Bob Miller", subject="Fwd: Pricing for 20 seats",
                       body=body)
    workflow_id = await env.deliver(raw)
    state, reason = await env.wait_state(workflow_id, {"awaiting_review", "completed",
                                                       "ignored"})
    assert state == "awaiting_review", reason
    row = await db.fetchrow("SELECT route_reasons, canonical_email, extraction"
                            " FROM inbound_events WHERE workflow_id = $1", workflow_id)
    assert row is not None
    assert row["route_reasons"][0] == "internal_forward"
    assert row["canonical_email"] == original
    extraction = row["extraction"]
    if isinstance(extraction, str):
        extraction = json.loads(extraction)
    assert extraction["sender_email"]["value"] == original
    for address in (original, colleague):
        assert await env.crm_records_for(address) == []
        assert await env.emails_to(address) == []
        assert await env.contacts_for(address) == 0


# --------------------------------------------------------------------------- IMAP + webhook

@pytest.fixture(scope="module")
def dovecot() -> Iterator[Dovecot]:
    if not dovecot_helper.available():
        pytest.skip(dovecot_helper.MISSING)
    root = Path(tempfile.mkdtemp(prefix="inboxcrm-dovecot-copies-"))
    server = Dovecot(root).start({USER: PASSWORD})
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def mailbox(stack: Stack, dovecot: Dovecot) -> Iterator[Mailbox]:
    box = Mailbox(stack, dovecot)
    yield box
    box.cli("mailbox", "remove", "--tenant", "acme", "--address", ADDRESS)
    box.worker.stop_all()


async def test_a_webhook_item_filed_into_two_watched_folders_is_one_item(
        env: StackClient, db: asyncpg.Pool, stack: Stack, mailbox: Mailbox,
        dovecot: Dovecot) -> None:
    """The webhook's delivery came first; the IMAP watcher then finds the same message in
    two folders of the tenant's mailbox: two copies of the one item, nothing run again."""
    other = f"T{uuid.uuid4().hex[:8]}"
    dovecot.create_folder(USER, other)
    email = unique_email("imapweb")
    message_id = f"<{uuid.uuid4().hex}@initech.example>"
    raw = crlf(message_from(email).replace("Message-ID: <", "X-Was: <", 1)
               .replace("\r\nDate:", f"\r\nMessage-ID: {message_id}\r\nDate:", 1))
    workflow_id = await env.deliver(raw)
    await env.wait_state(workflow_id, "completed")

    dovecot.deliver(USER, raw.encode(), mailbox.folder)
    dovecot.deliver(USER, raw.encode(), other)
    mailbox.worker.start()
    mailbox.add(other)

    async def two_copies() -> list[asyncpg.Record] | None:
        found = await copies_of(db, workflow_id)
        return found if len(found) >= 2 else None

    copies = await env.wait_for(two_copies, timeout=90, what="two IMAP copies recorded")
    uidvalidity = dovecot.status(USER, mailbox.folder)["uidvalidity"]
    assert sorted((c["source"], c["mailbox"], c["delivery_id"].split(":")[0])
                  for c in copies) == sorted([("imap", ADDRESS, mailbox.folder),
                                              ("imap", ADDRESS, other)])
    assert f"{mailbox.folder}:{uidvalidity}:1" in {c["delivery_id"] for c in copies}
    assert await env.count("SELECT count(*) FROM imap_messages WHERE message_id = $1"
                           " AND role = 'copy'", message_id) == 2
    synced = mailbox.cli("mailbox", "sync", "--tenant", "acme", "--address", ADDRESS,
                         "--json")
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout) == {"stored": 0, "duplicates": 0, "copies": 0}
    assert len(await copies_of(db, workflow_id)) == 2
    await assert_one_of_everything(env, db, email, message_id)
    done = cli(stack, "status", workflow_id)
    assert json.loads(done.stdout)["copies"]["sources"] == ["imap"]

    # The other order: the watcher stores a message first, then a webhook brings it.
    email = unique_email("imapfirst")
    message_id = f"<{uuid.uuid4().hex}@initech.example>"
    raw = crlf(message_from(email).replace("Message-ID: <", "X-Was: <", 1)
               .replace("\r\nDate:", f"\r\nMessage-ID: {message_id}\r\nDate:", 1))
    dovecot.deliver(USER, raw.encode(), mailbox.folder)

    async def imap_item() -> str | None:
        value = await db.fetchval(
            "SELECT workflow_id FROM inbound_events WHERE source = 'imap' AND message_id = $1"
            " AND state = 'completed'", message_id)
        return str(value) if value else None

    imap_workflow = await env.wait_for(imap_item, timeout=90, what="the IMAP item done")
    answer = await env.post(raw)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": "copy", "workflow_id": imap_workflow,
                             "state": "completed"}
    assert [c["source"] for c in await copies_of(db, imap_workflow)] == ["standard"]
    await assert_one_of_everything(env, db, email, message_id)
