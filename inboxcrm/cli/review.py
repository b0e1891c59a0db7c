"""The `review` group: reviewer decisions (Temporal updates) and the review card."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Annotated, Any

import asyncpg
import typer

from inboxcrm.cli.common import JsonOpt, ReviewerOpt, fail, out, settings_from_env, with_db
from inboxcrm.operator.reviewer_auth import REVIEWER_TOKEN_VARIABLE
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.contract import Decision

review_app = typer.Typer(no_args_is_help=True,
                         help="Reviewer decisions (Temporal updates) and the review card.")


def _acting_reviewer(settings: Settings, workflow_id: str) -> Any:
    """Reviewers as people (docs/architecture.md §6): the review commands act as the reviewer
    whose token is in INBOXCRM_REVIEWER_TOKEN, else as the operator (INBOXCRM_REVIEW_TOKEN);
    items of other tenants are "not found"; `--reviewer` is a label."""
    from inboxcrm.operator.reviewer_auth import NotAuthorised, cli_principal
    from inboxcrm.store import reviewers

    async def resolve(conn: asyncpg.Connection[Any]) -> tuple[Any, str | None]:
        principal = await cli_principal(conn, os.environ, settings)
        return principal, await reviewers.item_tenant(conn, workflow_id)

    try:
        principal, tenant = with_db(settings, resolve)
    except NotAuthorised as exc:
        fail(str(exc))
        raise
    if not principal.may_see(tenant):
        fail(f"no item with workflow ID {workflow_id!r}")
    return principal


def _decide(action: Decision, workflow_id: str, reviewer: str, note: str | None,
            evidence: str | None, wait_id: str | None, corrections: list[str] | None = None,
            send_followup: bool = True, as_json: bool = False,
            draft_file: Path | None = None) -> None:
    """Send a decision through the one decision client (`inboxcrm/platform/decisions.py`) and
    print the workflow's answer: accepted (the new state) or refused (the reason on stderr,
    exit 1)."""
    from inboxcrm.platform import temporal
    from inboxcrm.platform.decisions import DecisionRequest, send_decision
    from inboxcrm.platform.reviewer_identity import PATH_CLI

    pairs = [c.partition("=") for c in corrections or []]
    if any(not sep or not key for key, sep, _ in pairs):
        fail("--set takes FIELD=VALUE")
    settings = settings_from_env()
    token = os.environ.get(REVIEWER_TOKEN_VARIABLE, "").strip()
    if token:
        body: dict[str, Any] = {
            "workflow_id": workflow_id, "action": action.value, "reviewer": reviewer,
            "note": note, "evidence": evidence,
            "corrections": {key: value for key, _, value in pairs},
            "send_followup": send_followup, "wait_id": wait_id}
        if draft_file is not None:
            body["draft_text"] = _read_draft(draft_file)
        _decide_through_relay(settings, token, body, as_json)
        return
    principal = _acting_reviewer(settings, workflow_id)
    digest = (_propose_draft(settings, workflow_id, draft_file, principal.decider)
              if draft_file is not None else None)
    request = DecisionRequest(
        workflow_id=workflow_id, action=action, decider=principal, path=PATH_CLI,
        reviewer=reviewer, note=note, evidence=evidence,
        corrections={key: value for key, _, value in pairs}, send_followup=send_followup,
        wait_id=wait_id, draft_sha256=digest)
    secret = settings.decision_secret.get_secret_value() if settings.decision_secret else None
    result = asyncio.run(send_decision(lambda: temporal.connect(
        settings, namespace=temporal.namespace_for_workflow(settings, workflow_id)),
        secret, request))
    if not result.accepted or result.status is None:
        fail(result.message)
        return
    if as_json:
        import dataclasses

        out.print_json(json.dumps({"decision": action.value, "wait_id": result.wait_id,
                                   "workflow_id": workflow_id,
                                   "status": _jsonable(dataclasses.asdict(result.status))}))
        return
    out.print(result.message, highlight=False, markup=False, soft_wrap=True)


def _decide_through_relay(settings: Settings, token: str, body: dict[str, Any],
                          as_json: bool) -> None:
    """A reviewer's decision (INBOXCRM_REVIEWER_TOKEN) goes through the relay's
    `POST /v1/decisions` with their own token: the relay checks who they are and which tenants
    they review and signs the proof, so this machine holds no key (docs/architecture.md §6)."""
    import httpx

    relay = settings.public_relay_base_url
    try:
        response = httpx.post(f"{relay}/v1/decisions", json=body, timeout=60,
                              headers={"Authorization": f"Bearer {token}"})
        answer = response.json()
    except httpx.HTTPError as exc:
        fail(f"relay not reachable at {relay} ({type(exc).__name__}); set "
             "INBOXCRM_PUBLIC_RELAY_URL to the relay's address")
        return
    except ValueError:
        fail(f"the relay at {relay} answered {response.status_code} without a decision")
        return
    if not answer.get("accepted") or answer.get("status") is None:
        fail(str(answer.get("message") or f"refused ({response.status_code})"))
        return
    if as_json:
        out.print_json(json.dumps({"decision": body["action"], "wait_id": answer["wait_id"],
                                   "workflow_id": body["workflow_id"],
                                   "status": answer["status"]}))
        return
    out.print(answer["message"], highlight=False, markup=False, soft_wrap=True)


def _read_draft(draft_file: Path) -> str:
    try:
        return draft_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"--draft-file: cannot read it as UTF-8 text ({type(exc).__name__})")
        raise


def _propose_draft(settings: Settings, workflow_id: str, draft_file: Path,
                   decider: str) -> str:
    """Store the edited follow-up of the item's intent awaiting approval, checked against
    its rule's limits (docs/architecture.md §6, "Edited drafts"); the approval then binds its
    hash. A refusal names the limit, never the text."""
    from inboxcrm.domain import drafts
    from inboxcrm.store import intents

    text = _read_draft(draft_file)

    async def store(conn: asyncpg.Connection[Any]) -> drafts.DraftCheck:
        intent_id = await intents.intent_of_workflow(conn, workflow_id=workflow_id)
        if intent_id is None:
            return drafts.DraftCheck("draft_not_awaiting", "refused (draft_not_awaiting): "
                                     "this item has no follow-up waiting for approval")
        return await drafts.propose(conn, intent_id=intent_id, text=text,
                                    proposed_by=decider, settings=settings)

    checked = with_db(settings, store)
    if checked.refused is not None:
        fail(checked.message)
    return checked.sha256


def _jsonable(value: Any) -> Any:
    """A status dataclass as JSON (enums by value)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return getattr(value, "value", value)


@review_app.command("show")
def review_show(workflow_id: str, as_json: JsonOpt = False) -> None:
    """The review card in the terminal: message with the lines behind the reason marked,
    fields and evidence, candidates, suppression, proposed follow-up, decisions allowed now."""
    import dataclasses

    from inboxcrm.domain.review_card import build_card, render_text

    settings = settings_from_env()
    _acting_reviewer(settings, workflow_id)
    card = with_db(settings, lambda conn: build_card(conn, workflow_id))
    if card is None:
        fail(f"no item with workflow ID {workflow_id!r}")
        return
    if as_json:
        out.print_json(json.dumps(dataclasses.asdict(card)))
        return
    for line in render_text(card):
        style = "bold yellow" if line.startswith(">> ") else (
            "bold" if line.startswith("== ") else None)
        out.print(line, style=style, highlight=False, markup=False, soft_wrap=True)


NoteOpt = Annotated[str | None, typer.Option("--note")]
EvidenceOpt = Annotated[str | None, typer.Option("--evidence")]
WaitOpt = Annotated[str | None, typer.Option(
    "--wait-id", help="The wait you decide on (from `review show`); default: the open one.")]


@review_app.command("approve")
def review_approve(workflow_id: str, reviewer: ReviewerOpt, note: NoteOpt = None,
                   evidence: EvidenceOpt = None, wait_id: WaitOpt = None,
                   set_: Annotated[list[str] | None, typer.Option(
                       "--set", help="Corrected field, e.g. --set sender_email=a@b.test")] = None,
                   send_followup: Annotated[bool, typer.Option(
                       "--send-followup/--no-send-followup",
                       help="Continue without the follow-up email.")] = True,
                   draft_file: Annotated[Path | None, typer.Option(
                       "--draft-file", help="A follow-up held for approval: send this edited "
                       "plain text instead (within the limits `review show` lists); the "
                       "approval binds its SHA-256.")] = None,
                   as_json: JsonOpt = False) -> None:
    """Approve what the open wait asks (a follow-up approval: that intent only, as rendered
    or as edited with --draft-file)."""
    _decide(Decision.APPROVE, workflow_id, reviewer, note, evidence, wait_id, set_,
            send_followup, as_json, draft_file)


@review_app.command("hold")
def review_hold(workflow_id: str, reviewer: ReviewerOpt, note: NoteOpt = None,
                evidence: EvidenceOpt = None, wait_id: WaitOpt = None,
                as_json: JsonOpt = False) -> None:
    """Keep the item parked (state `held`) until another decision."""
    _decide(Decision.HOLD, workflow_id, reviewer, note, evidence, wait_id, as_json=as_json)


@review_app.command("reject")
def review_reject(workflow_id: str, reviewer: ReviewerOpt, note: NoteOpt = None,
                  evidence: EvidenceOpt = None, wait_id: WaitOpt = None,
                  as_json: JsonOpt = False) -> None:
    """End the item as `rejected`: nothing more is sent or written."""
    _decide(Decision.REJECT, workflow_id, reviewer, note, evidence, wait_id, as_json=as_json)


@review_app.command("retry")
def review_retry(workflow_id: str, reviewer: ReviewerOpt, note: NoteOpt = None,
                 evidence: EvidenceOpt = None, wait_id: WaitOpt = None,
                 as_json: JsonOpt = False) -> None:
    """Retry a blocked/ambiguous step with the same operation key (a fresh bounded budget)."""
    _decide(Decision.RETRY, workflow_id, reviewer, note, evidence, wait_id, as_json=as_json)


@review_app.command("resolve")
def review_resolve(workflow_id: str, reviewer: ReviewerOpt, note: NoteOpt = None,
                   evidence: EvidenceOpt = None, wait_id: WaitOpt = None,
                   as_json: JsonOpt = False) -> None:
    """Mark the blocked/ambiguous side effect as done, with evidence (e.g. the CRM record ID)."""
    _decide(Decision.RESOLVE, workflow_id, reviewer, note, evidence, wait_id, as_json=as_json)


@review_app.command("send-again")
def review_send_again(workflow_id: str, reviewer: ReviewerOpt,
                      reason: Annotated[str, typer.Option(
                          "--reason", help="Why the customer should get the follow-up again "
                          "(recorded with the approval).")],
                      wait_id: WaitOpt = None, as_json: JsonOpt = False) -> None:
    """Send an unconfirmed follow-up again, deliberately: a new intent with its own
    idempotency key and this approval (the customer may get two; the first intent stays as
    it was). Only the role the tenant's policy names (`authority.repeat_customer_facing`)."""
    if not reason.strip():
        fail("--reason must say why the customer should get the follow-up again")
    _decide(Decision.SEND_AGAIN, workflow_id, reviewer, reason, None, wait_id, as_json=as_json)
