"""Drafts a reviewer can edit (issue 37, docs/architecture.md §6 "Edited drafts"), on real
components. initech's rule sends automatically only to known customers, declares draft
limits (1,200 characters, the signature kept, and always the opt-out link and the postal
address) and names an approver role (`authority.approve_followup: approver`). A new person's
follow-up waits for approval; a reviewer without the role is refused; an edit breaking a
limit is refused, naming it; a proof replayed with another text is refused; the approver's
edit goes out word for word, one email under the intent's key; the same person writing
again is a known customer and is answered automatically. A sensitive attribute in the
writer's own text routes the item to review."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.worker import Replayer

from inboxcrm.domain import drafts
from inboxcrm.domain.followup import draft_sha256
from inboxcrm.platform import atrest, temporal
from inboxcrm.platform.config import Settings
from inboxcrm.platform.decisions import DecisionRequest, decision_body
from inboxcrm.platform.reviewer_identity import PATH_CLI, Principal
from inboxcrm.schemas.contract import Decision
from inboxcrm.schemas.models import ItemStatus
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow
from tests.helpers.cli import as_reviewer, cli
from tests.helpers.histories import store_history

TENANT, MAILBOX = "initech", "sales@initech.test"
SIGNATURE = "The Initech sales team"
POSTAL = "Initech Inc., 4120 Freidrich Lane, Austin, TX 78744, USA"


def _reviewer(stack: Stack, name: str, role: str) -> str:
    added = cli(stack, "reviewer", "add", name, "--tenant", TENANT, "--role", role, "--json")
    assert added.returncode == 0, added.stderr
    return str(json.loads(added.stdout)["token"])


def _to_initech(email: str, body: str = "Hi, could you send me pricing for 20 seats?") -> str:
    return message_from(email, body=body + "\n\nThanks,\nJo Doe").replace(
        "sales@acme.test", MAILBOX)


async def _intent(env: StackClient, workflow_id: str) -> dict[str, Any]:
    row = await env.db.fetchrow(
        "SELECT i.intent_id::text AS intent_id, i.status, i.approval_reason, i.approved_by, "
        "i.draft_sha256, i.approved_draft_sha256 FROM followup_intents i "
        "JOIN inbound_events e ON e.event_id = i.event_id WHERE e.workflow_id = $1",
        workflow_id)
    assert row is not None
    return dict(row)


def _approve(stack: Stack, token: str, workflow_id: str, draft: Path | None = None
             ) -> tuple[int, str]:
    args = ["review", "approve", workflow_id, "--reviewer", "ann"]
    if draft is not None:
        args += ["--draft-file", str(draft)]
    done = as_reviewer(stack, token, *args)
    return done.returncode, done.stdout + done.stderr


async def test_an_approver_edits_the_draft_and_exactly_that_text_is_sent(
        env: StackClient, stack: Stack, app_settings: Settings, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:6]
    sales_token = _reviewer(stack, f"sid-{suffix}", "reviewer")
    approver_token = _reviewer(stack, f"ann-{suffix}", "approver")
    email = unique_email("drafts")
    workflow_id = await env.deliver(_to_initech(email), tenant=TENANT, mailbox=MAILBOX)

    # A new person under `auto_send: known_customers`: the follow-up waits for approval.
    await env.wait_state(workflow_id, "awaiting_review", timeout=90)
    status = await env.query_status(workflow_id)
    review = status["review"]
    assert review["reason"] == "unknown_customer" and review["wait_id"].endswith("-followup")
    assert review["approve_role"] == "approver"
    intent = await _intent(env, workflow_id)
    assert intent["status"] == "awaiting_approval"
    assert intent["approval_reason"] == "unknown_customer"
    shown = as_reviewer(stack, approver_token, "review", "show", workflow_id)
    assert "at most 1200 characters" in shown.stdout, shown.stdout + shown.stderr

    opt_out = next(line for line in shown.stdout.splitlines() if "/v1/unsubscribe/" in line)
    link = opt_out[opt_out.index("http"):].strip()
    edited = (f"Hi Jo,\n\nthanks for asking about 20 seats: Priya will call you on Monday "
              f"with a quote.\n\nBest regards\n{SIGNATURE}\n\n--\n{POSTAL}\n"
              f"To receive no further emails from us: {link}\n")

    # Refused: a reviewer without the approver role (the client and the workflow).
    code, said = _approve(stack, sales_token, workflow_id)
    assert code != 0 and "authority_required" in said
    # Refused: edits that break a limit; nothing stored, nothing sent.
    too_long = tmp_path / "long.txt"
    too_long.write_text(edited + "x" * 1200, encoding="utf-8")
    code, said = _approve(stack, approver_token, workflow_id, too_long)
    assert code != 0 and "draft_too_long" in said and "1200 characters" in said
    unsigned = tmp_path / "unsigned.txt"
    unsigned.write_text(edited.replace(SIGNATURE, "Priya"), encoding="utf-8")
    code, said = _approve(stack, approver_token, workflow_id, unsigned)
    assert code != 0 and "draft_missing:signature" in said
    assert "Priya will call" not in said  # the refusal names the limit, not the text
    assert (await _intent(env, workflow_id))["draft_sha256"] is None

    # Refused: a proof replayed with another text.
    async with env.db.acquire() as conn:
        first = await drafts.propose(conn, intent_id=intent["intent_id"], text=edited,
                                     proposed_by="test", settings=app_settings)
        assert first.refused is None, first.message
        other = edited.replace("Monday", "Tuesday")
        second = await drafts.propose(conn, intent_id=intent["intent_id"], text=other,
                                      proposed_by="test", settings=app_settings)
        assert second.refused is None, second.message
    # The stored draft is ciphertext (sealed at rest, column and row bound); its hash is
    # over the plaintext, and the card opens it to show the words.
    stored = await env.db.fetchval("SELECT draft_text FROM followup_intents "
                                   "WHERE intent_id = $1::uuid", intent["intent_id"])
    assert stored.startswith(atrest.TEXT_PREFIX) and "Priya" not in stored
    assert (await _intent(env, workflow_id))["draft_sha256"] == draft_sha256(other)
    card = as_reviewer(stack, approver_token, "review", "show", workflow_id)
    assert "Priya will call you on Tuesday" in card.stdout, card.stdout + card.stderr
    ann = Principal(f"reviewer:ann-{suffix}", f"ann-{suffix}", frozenset({TENANT}),
                    role="approver")
    secret = stack.env["INBOXCRM_DECISION_SECRET"]
    wait_id = review["wait_id"]
    signed = decision_body(DecisionRequest(workflow_id, Decision.APPROVE, ann, PATH_CLI,
                                           reviewer="ann", wait_id=wait_id,
                                           draft_sha256=first.sha256), secret, wait_id)
    handle = (await env.temporal()).get_workflow_handle(workflow_id)
    for body, why in ((dataclasses.replace(signed, draft_sha256=second.sha256), "proof"),
                      (signed, "draft_not_found")):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(Decision.APPROVE.value, body, result_type=ItemStatus)
        assert why in str(getattr(refused.value.cause, "message", refused.value))
    assert await env.emails_to(email) == []
    assert (await env.state(workflow_id))[0] == "awaiting_review"

    # The approver's edit: accepted, and exactly that text is sent, once.
    draft = tmp_path / "draft.txt"
    draft.write_text(edited, encoding="utf-8")
    code, said = _approve(stack, approver_token, workflow_id, draft)
    assert code == 0, said
    await env.wait_state(workflow_id, "completed", timeout=90)
    sent = await env.emails_to(email)
    assert len(sent) == 1
    body = await env.http.get(f"{env.endpoints.sandbox_url}/emails/{sent[0]['id']}")
    body.raise_for_status()
    assert body.json()["text"] == edited and not body.json()["html"]
    assert (await env.db.fetchval(
        "SELECT draft_text FROM followup_intents WHERE intent_id = $1::uuid",
        intent["intent_id"])).startswith(atrest.TEXT_PREFIX)
    approved = await _intent(env, workflow_id)
    assert approved["status"] == "sent"
    assert approved["approved_draft_sha256"] == draft_sha256(edited)
    assert sent[0]["idempotency_key"] == approved["intent_id"]
    audit = await env.db.fetch("SELECT detail FROM audit_log WHERE workflow_id = $1 AND "
                               "action = 'followup_approved'", workflow_id)
    assert [a["detail"]["draft_sha256"] for a in audit] == [draft_sha256(edited)]
    logged = await env.db.fetch("SELECT detail::text AS d FROM audit_log "
                                "WHERE workflow_id = $1", workflow_id)
    assert not any("Priya will call" in r["d"] for r in logged)  # the text is never audited
    decisions = await env.db.fetch(
        "SELECT detail FROM audit_log WHERE workflow_id = $1 AND action = 'update_approve' "
        "ORDER BY audit_id", workflow_id)
    assert [d["detail"]["ignored_reason"] for d in decisions] == [
        "authority_required", "proof_invalid", "draft_not_found", None][-len(decisions):]

    # Its history replays (stored for later releases with INBOXCRM_CAPTURE_HISTORIES).
    client = await temporal.connect(app_settings)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(workflows=[InboundEmailWorkflow], data_converter=client.data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
    if label := os.environ.get("INBOXCRM_CAPTURE_HISTORIES"):
        store_history(history, f"{label}-edited-draft", app_settings)

    # The same person again: a known customer now (a CRM record), answered automatically.
    again = await env.deliver(_to_initech(email, "One more question: is there a trial?"),
                              tenant=TENANT, mailbox=MAILBOX)
    await env.wait_state(again, "completed", timeout=90)
    assert (await _intent(env, again))["approval_reason"] is None
    assert len(await env.emails_to(email)) == 2


async def test_a_sensitive_attribute_routes_to_review(env: StackClient, stack: Stack) -> None:
    email = unique_email("sensitive")
    workflow_id = await env.deliver(message_from(
        email, body="Hi, I was diagnosed with diabetes and need an accessible plan. "
        "Pricing for 20 seats?\n\nThanks,\nJo Doe"))
    await env.wait_state(workflow_id, "awaiting_review", timeout=90)
    status = await env.query_status(workflow_id)
    assert status["review"]["reason"] == "sensitive_attribute"
    assert await env.emails_to(email) == []
    rejected = cli(stack, "review", "reject", workflow_id, "--reviewer", "ops")
    assert rejected.returncode == 0, rejected.stderr


async def test_the_desk_offers_the_text_and_sends_the_edit_it_posts(
        env: StackClient, stack: Stack) -> None:
    """The desk's card carries the rendered follow-up in a textarea with its limits; the
    approve form posted with an edited text (a browser's CRLF line ends) stores the draft
    and sends exactly it (line ends as LF)."""
    token = _reviewer(stack, f"amy-{uuid.uuid4().hex[:6]}", "approver")
    email = unique_email("deskdraft")
    workflow_id = await env.deliver(_to_initech(email), tenant=TENANT, mailbox=MAILBOX)
    await env.wait_state(workflow_id, "awaiting_review", timeout=90)
    url = f"{stack.relay_url}/review/{quote(workflow_id, safe='')}"
    auth = {"Authorization": f"Bearer {token}"}
    page = (await env.http.get(url, headers=auth)).text
    assert "<textarea name='draft'" in page and "at most 1200 characters" in page
    card = (await env.http.get(url, headers=auth | {"Accept": "application/json"})).json()
    rendered = card["followup"]["body"]
    assert card["followup"]["editable"] and card["followup"]["max_chars"] == 1200

    def hidden(name: str) -> str:
        found = re.search(rf"name='{name}' value='([^']*)'", page)
        assert found, name
        return html.unescape(found.group(1))

    edited = rendered.replace("A member of our team will reply shortly.",
                              "Priya will send you the quote for 20 seats today.")
    assert edited != rendered
    posted = await env.http.post(url, content=urlencode({
        "csrf": hidden("csrf"), "action": "approve", "wait_id": card["wait_id"],
        "reviewer": "amy", "send_followup": "yes", "intent_id": hidden("intent_id"),
        "rendered_sha256": hidden("rendered_sha256"),
        "draft": edited.replace("\n", "\r\n")}),
        headers=auth | {"Content-Type": "application/x-www-form-urlencoded"})
    assert posted.status_code == 200, posted.text
    stored = await env.db.fetchval(  # sealed by the relay, opened by the worker to send
        "SELECT i.draft_text FROM followup_intents i JOIN inbound_events e USING (event_id) "
        "WHERE e.workflow_id = $1", workflow_id)
    assert stored.startswith(atrest.TEXT_PREFIX) and "Priya" not in stored
    await env.wait_state(workflow_id, "completed", timeout=90)
    [sent] = await env.emails_to(email)
    body = await env.http.get(f"{env.endpoints.sandbox_url}/emails/{sent['id']}")
    assert body.json()["text"] == edited
    assert (await _intent(env, workflow_id))["approved_draft_sha256"] == draft_sha256(edited)
