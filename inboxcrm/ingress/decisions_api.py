"""`POST /v1/decisions`: a reviewer's decision sent with their own token, for the CLI
(docs/architecture.md §6, "Reviewers as people").

A reviewer's CLI then holds no key: the relay authenticates the bearer token (a personal
token, an SSO access token or the operator's), checks that the item is of a tenant the person
reviews (else 404, as the desk), and sends the decision through the one decision client with
its proof, which only the relay can sign. A bearer token only, never a cookie: no browser sends
one across sites, so there is nothing to forge, and the route answers no CORS preflight."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inboxcrm.domain import drafts
from inboxcrm.domain.drafts import DraftCheck
from inboxcrm.ingress.deps import DeskPoolDep, IngestorDep
from inboxcrm.ingress.reviewer_auth import DeskAuth
from inboxcrm.ingress.web import read_body
from inboxcrm.platform.config import Settings
from inboxcrm.platform.decisions import DecisionRequest, send_decision
from inboxcrm.platform.reviewer_identity import PATH_CLI
from inboxcrm.schemas.contract import Decision
from inboxcrm.store import intents
from inboxcrm.store import reviewers as reviewer_store

# Room for an edited draft (its draft limits cap it at `max_chars`, at most 20,000), as JSON.
MAX_DECISION_BYTES = 160 * 1024
MAX_DRAFT_CHARS = 20_000  # the most any draft limit allows (`max_chars`)
_TEXT = 2000


class DecisionBodyIn(BaseModel):
    """What the CLI sends; the decider is the token's, never a field."""

    model_config = ConfigDict(extra="forbid")

    workflow_id: str = Field(min_length=1, max_length=512)
    action: Decision
    reviewer: str = Field(default="", max_length=_TEXT)
    note: str | None = Field(default=None, max_length=_TEXT)
    evidence: str | None = Field(default=None, max_length=_TEXT)
    corrections: dict[str, str] = Field(default_factory=dict, max_length=8)
    send_followup: bool = True
    wait_id: str | None = Field(default=None, max_length=128)
    # An approval's edited follow-up (docs/architecture.md §6, "Edited drafts"): stored with
    # the item's intent after its rule's limits are checked; the decision binds its hash.
    draft_text: str | None = Field(default=None, max_length=MAX_DRAFT_CHARS + 1)


def jsonable(value: Any) -> Any:
    """A status dataclass as JSON (enums by value)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return getattr(value, "value", value)


def _answer(code: int, **body: Any) -> JSONResponse:
    return JSONResponse(body, status_code=code, headers={"Cache-Control": "no-store"})


async def _propose(desk: asyncpg.Pool, settings: Settings, workflow_id: str, text: str,
                   decider: str) -> DraftCheck:
    """The edited draft stored with the item's intent, under the desk's database role (the
    check reads the contact, which the relay's intake role may not)."""
    async with desk.acquire() as conn:
        intent_id = await intents.intent_of_workflow(conn, workflow_id=workflow_id)
        if intent_id is None:
            return DraftCheck("draft_not_awaiting", "refused (draft_not_awaiting): this item "
                              "has no follow-up waiting for approval")
        return await drafts.propose(conn, intent_id=intent_id, text=text, proposed_by=decider,
                                    settings=settings)


def decisions_router(settings: Settings) -> APIRouter:
    auth = DeskAuth(settings)
    router = APIRouter()

    async def decide(request: Request, ingestor: IngestorDep,
                     desk: DeskPoolDep) -> JSONResponse:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _answer(401, accepted=False, message="send your reviewer token as "
                           "Authorization: Bearer")
        raw = await read_body(request, MAX_DECISION_BYTES)
        if raw is None:
            return _answer(413, accepted=False, message="decision too large")
        try:
            body = DecisionBodyIn.model_validate_json(raw)
        except ValidationError as exc:
            fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
            return _answer(422, accepted=False, message=f"invalid decision: {fields}")
        async with ingestor.pool.acquire() as conn:
            principal = await auth.from_token(conn, token)
            tenant = (await reviewer_store.item_tenant(conn, body.workflow_id)
                      if principal is not None else None)
        if principal is None:
            return _answer(401, accepted=False, message="not the token of a current reviewer "
                           "(revoked, expired or mistyped)")
        if not principal.may_see(tenant):
            return _answer(404, accepted=False,
                           message=f"no item with workflow ID {body.workflow_id!r}")
        digest = None
        if body.draft_text is not None:
            if body.action != Decision.APPROVE:
                return _answer(422, accepted=False, message="an edited draft goes with approve")
            checked = await _propose(desk, settings, body.workflow_id, body.draft_text,
                                     principal.decider)
            if checked.refused is not None:
                return _answer(409, accepted=False, outcome="refused", message=checked.message,
                               wait_id=body.wait_id or "", status=None)
            digest = checked.sha256
        # The item's namespace (its tenant's: docs/architecture.md §7, Namespaces).
        connect = functools.partial(ingestor.temporal.for_workflow, body.workflow_id)
        result = await send_decision(connect, auth.decision_secret, DecisionRequest(
            workflow_id=body.workflow_id, action=body.action, decider=principal, path=PATH_CLI,
            reviewer=body.reviewer or principal.name, note=body.note, evidence=body.evidence,
            corrections=body.corrections, send_followup=body.send_followup,
            wait_id=body.wait_id, draft_sha256=digest))
        status = (jsonable(dataclasses.asdict(result.status))
                  if result.status is not None else None)
        return _answer(200 if result.accepted else 409, accepted=result.accepted,
                       outcome=result.outcome, message=result.message, wait_id=result.wait_id,
                       status=status)

    router.add_api_route("/v1/decisions", decide, methods=["POST"], response_model=None,
                         include_in_schema=False)
    return router
