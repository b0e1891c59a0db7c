"""The review desk over HTTP (docs/architecture.md §6, §10): `GET /review/` (the queue of the
reviewer's tenants, oldest first), `GET /review/{workflow_id}` (the ID URL-encoded: the review
card, linked from the workflow's current details in the Temporal UI) and `POST` to the same
URL (a decision on the open wait).

Access: a reviewer's personal token, the operator's all-tenant `INBOXCRM_REVIEW_TOKEN`, or an
access token of the OIDC issuer, as `Authorization: Bearer …`, or the session cookie of the
login form at `/review/login` (a token in a POST body, never in a URL); 401 otherwise. Items of
tenants outside the reviewer's answer 404, whether read or decided.

A decision is a plain HTML form (no JavaScript) bound to the wait ID, sent as the workflow's
own Temporal Update by the one decision client (`inboxcrm/platform/decisions.py`: the body
with the authenticated decider and its proof); the page shows the workflow's answer
(accepted, with the new state, or its refusal). Forms carry a CSRF token bound to the
session; cross-site requests are refused by `Sec-Fetch-Site` / `Origin`; the cookie is
`SameSite=Strict; HttpOnly`. No personal data in URLs, logs or metrics; every response is
`no-store`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from html import escape
from typing import Any
from urllib.parse import parse_qs, quote

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from temporalio.client import Client

from inboxcrm.domain import drafts
from inboxcrm.domain.drafts import DraftCheck
from inboxcrm.domain.followup import draft_sha256
from inboxcrm.domain.review_card import ReviewCard, age_text, card_facts, read_message
from inboxcrm.ingress.deps import DeskPoolDep, IngestorDep, WorkDep
from inboxcrm.ingress.intake import Ingestor
from inboxcrm.ingress.reviewer_auth import COOKIE, DeskAuth, Visitor
from inboxcrm.ingress.web import read_body
from inboxcrm.platform.config import Settings
from inboxcrm.platform.decisions import DecisionRequest, DecisionResult, send_decision
from inboxcrm.platform.reviewer_identity import PATH_DESK, Principal
from inboxcrm.platform.workpool import Runner
from inboxcrm.schemas.contract import Decision
from inboxcrm.store import intents
from inboxcrm.store import reviewers as reviewer_store

MAX_LOGIN_BYTES = 4096
# Room for an edited draft (its draft limits cap it at `max_chars`, at most 20,000), encoded.
MAX_FORM_BYTES = 128 * 1024
MAX_FIELD_CHARS = 2000
MAX_DRAFT_CHARS = 20_000
CORRECTABLE = ("sender_email", "name", "company")
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    # Not "no-referrer": under it a browser sends `Origin: null` with the desk's own form
    # posts, which the cross-site check must refuse. Same-origin: nothing leaves the relay.
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                               "form-action 'self'; frame-ancestors 'none'",
}
STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem;max-width:70rem;color:#222}
h1{font-size:1.3rem} h2{font-size:1.05rem;margin-top:1.6rem;border-bottom:1px solid #ccc}
pre{background:#f6f6f6;padding:.6rem;white-space:pre-wrap} mark{background:#ffe066}
table{border-collapse:collapse} td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:left}
.tag{font-size:.8em;color:#8a5a00} code{background:#f0f0f0}
form.decision{border:1px solid #ccc;padding:.6rem;margin:.6rem 0}
form.decision label{display:block;margin:.2rem 0}
.answer{padding:.6rem;border:2px solid} .accepted{border-color:#2a7} .refused{border-color:#c33}
"""


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    html = (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def _login_form(next_path: str, message: str = "", status: int = 200) -> HTMLResponse:
    note = f"<p><strong>{escape(message)}</strong></p>" if message else ""
    return _page("inboxcrm review: sign in", (
        "<h1>inboxcrm review desk</h1>" + note +
        "<p>Paste your personal reviewer token (from <code>inboxcrm reviewer add</code>), or "
        "the operator's <code>INBOXCRM_REVIEW_TOKEN</code>.</p>"
        "<form method='post' action='/review/login'>"
        f"<input type='hidden' name='next' value='{escape(next_path, quote=True)}'>"
        "<label>Review token <input type='password' name='token' autocomplete='off'></label> "
        "<button type='submit'>Sign in</button></form>"), status)


def _safe_next(value: str | None) -> str:
    """Only a page of the desk on this relay: never an open redirect."""
    if value and value.startswith("/review/") and not value.startswith("//") and (
            "\\" not in value):
        return value
    return "/review/"


def _not_found() -> HTMLResponse:
    return _page("not found", "<p>No item with this workflow ID.</p>", 404)


def _card_path(workflow_id: str) -> str:
    return "/review/" + quote(workflow_id, safe="")


def _field(form: Mapping[str, list[str]], name: str) -> str:
    return (form.get(name) or [""])[0].strip()[:MAX_FIELD_CHARS]


def decision_request(form: Mapping[str, list[str]], principal: Principal,
                     workflow_id: str) -> DecisionRequest | str:
    """A decision form as the decision client's request, or why it is refused as it stands.
    The form names the wait it answers; the decider is the one signed in, never a field."""
    action = _field(form, "action")
    if action not in {d.value for d in Decision}:
        return "refused: no such decision"
    return DecisionRequest(
        workflow_id=workflow_id, action=Decision(action), decider=principal, path=PATH_DESK,
        reviewer=_field(form, "reviewer") or principal.name, wait_id=_field(form, "wait_id"),
        note=_field(form, "note") or None, evidence=_field(form, "evidence") or None,
        corrections={n: v for n in CORRECTABLE if (v := _field(form, n))},
        send_followup=_field(form, "send_followup") != "no")


def edited_draft(form: Mapping[str, list[str]]) -> str | None:
    """The approve form's edited follow-up (not stripped: its words are sent as written), or
    None when it is absent or is the rendered text unchanged (`rendered_sha256`)."""
    text = (form.get("draft") or [""])[0]
    if not text.strip() or draft_sha256(text) == _field(form, "rendered_sha256"):
        return None
    return text[:MAX_DRAFT_CHARS + 1]


ProposeDraft = Callable[[str, str], Awaitable[DraftCheck]]


async def send_form_decision(connect: Callable[[], Awaitable[Client]], secret: str | None,
                             principal: Principal, workflow_id: str,
                             form: Mapping[str, list[str]],
                             propose: ProposeDraft | None = None) -> DecisionResult:
    """The desk's decision path: the form, through the one decision client, to the workflow's
    answer (a fast test calls it without a relay). An approval with an edited draft stores
    the draft with its intent first (`propose`: intent ID and text → the check), checked
    against the rule's limits; the decision carries its hash."""
    request = decision_request(form, principal, workflow_id)
    if isinstance(request, str):
        return DecisionResult(False, "refused", request, _field(form, "wait_id"))
    text = edited_draft(form) if request.action == Decision.APPROVE else None
    if text is not None:
        intent_id = _field(form, "intent_id")
        if propose is None or not intent_id:
            return DecisionResult(False, "refused", "refused: this desk cannot store an "
                                  "edited draft here; approve without editing",
                                  request.wait_id or "")
        checked = await propose(intent_id, text)
        if checked.refused is not None:
            return DecisionResult(False, "refused", checked.message, request.wait_id or "")
        request = dataclasses.replace(request, draft_sha256=checked.sha256)
    result = await send_decision(connect, secret, request)
    if result.accepted:
        return dataclasses.replace(
            result, message=result.message + "; the card below shows where the item is now")
    return result


class ReviewDesk:
    """The desk's routes as methods over its credentials (`DeskAuth`), so a test can build one
    from settings and call a handler; `router()` registers them."""

    def __init__(self, settings: Settings) -> None:
        self.auth = DeskAuth(settings)
        self._settings = settings
        self.secure_cookie = settings.public_relay_base_url.startswith("https://")

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/review/login", self.login_form, methods=["GET"],
                             response_class=HTMLResponse)
        router.add_api_route("/review/login", self.login, methods=["POST"],
                             response_model=None)
        router.add_api_route("/review/logout", self.logout, methods=["POST"],
                             response_model=None)
        router.add_api_route("/review/{workflow_id:path}", self.review_page, methods=["GET"],
                             response_model=None)
        router.add_api_route("/review/{workflow_id:path}", self.decide, methods=["POST"],
                             response_model=None)
        return router

    async def who(self, request: Request, ingestor: Ingestor) -> Visitor | None:
        async with ingestor.pool.acquire() as conn:
            return await self.auth.visitor(request, conn)

    async def login_form(self, request: Request) -> HTMLResponse:
        return _login_form(_safe_next(request.query_params.get("next")))

    async def login(self, request: Request, ingestor: IngestorDep) -> Response:
        auth = self.auth
        if auth.cross_site(request):
            return _page("refused", "<p>Cross-site sign-in refused.</p>", 403)
        body = await read_body(request, MAX_LOGIN_BYTES)
        if body is None:
            return _login_form("/review/", "request too large", 413)
        form = parse_qs(body.decode("utf-8", "replace"))
        next_path = _safe_next(_field(form, "next"))
        async with ingestor.pool.acquire() as conn:
            principal = await auth.from_token(conn, _field(form, "token"))
            session = (await auth.start_session(conn, principal) if principal is not None
                       else None)
        if session is None:
            return _login_form(next_path, "wrong or missing token", 401)
        value, max_age = session
        response = RedirectResponse(next_path, status_code=303,
                                    headers={"Cache-Control": "no-store"})
        response.set_cookie(COOKIE, value, max_age=max_age, path="/review", httponly=True,
                            samesite="strict",
                            secure=self.secure_cookie or request.url.scheme == "https")
        return response

    async def logout(self, request: Request, ingestor: IngestorDep) -> Response:
        if self.auth.cross_site(request):
            return _page("refused", "<p>Cross-site request refused.</p>", 403)
        async with ingestor.pool.acquire() as conn:
            await self.auth.end_session(conn, request.cookies.get(COOKIE))
        response = RedirectResponse("/review/login", status_code=303,
                                    headers={"Cache-Control": "no-store"})
        response.delete_cookie(COOKIE, path="/review")
        return response

    async def review_page(self, workflow_id: str, request: Request, ingestor: IngestorDep,
                          work: WorkDep, desk: DeskPoolDep) -> Response:
        visitor = await self.who(request, ingestor)
        if visitor is None:
            target = _card_path(workflow_id) if workflow_id else "/review/"
            return _login_form(target, "sign in to the review desk", 401)
        if not workflow_id:
            return await self._queue(request, ingestor, visitor)
        return await self._card(request, desk, work, visitor, workflow_id)

    async def decide(self, workflow_id: str, request: Request, ingestor: IngestorDep,
                     work: WorkDep, desk: DeskPoolDep) -> Response:
        auth = self.auth
        if auth.cross_site(request):
            return _page("refused", "<p>Cross-site request refused: decide from the desk's "
                         "own page.</p>", 403)
        visitor = await self.who(request, ingestor)
        if visitor is None:
            return _login_form(_card_path(workflow_id), "sign in to decide", 401)
        body = await read_body(request, MAX_FORM_BYTES)
        if body is None:
            return _page("too large", "<p>Form too large.</p>", 413)
        form = parse_qs(body.decode("utf-8", "replace"))
        if not auth.csrf_ok(visitor, _field(form, "csrf")):
            return _page("refused", "<p>The form is stale or did not come from this desk: "
                         "reload the card and decide again.</p>", 403)
        async with ingestor.pool.acquire() as conn:
            tenant = await reviewer_store.item_tenant(conn, workflow_id)
        if not visitor.principal.may_see(tenant):
            return _not_found()

        async def propose(intent_id: str, text: str) -> DraftCheck:
            # The draft's check reads the contact (its rule's terms): the desk's role.
            async with desk.acquire() as conn:
                if await intents.intent_of_workflow(conn, workflow_id=workflow_id,
                                                    intent_id=intent_id) is None:
                    return DraftCheck("draft_not_awaiting", "refused (draft_not_awaiting): "
                                      "no such follow-up on this item")
                return await drafts.propose(conn, intent_id=intent_id, text=text,
                                            proposed_by=visitor.principal.decider,
                                            settings=self._settings)

        # The item's namespace (its tenant's: docs/architecture.md §7, Namespaces).
        connect = functools.partial(ingestor.temporal.for_workflow, workflow_id)
        result = await send_form_decision(connect, auth.decision_secret,
                                          visitor.principal, workflow_id, form, propose)
        return await self._card(request, desk, work, visitor, workflow_id,
                                answer=(result.accepted, result.message),
                                status=200 if result.accepted else 409)

    async def _queue(self, request: Request, ingestor: Ingestor, visitor: Visitor) -> Response:
        tenants = visitor.principal.tenants
        async with ingestor.pool.acquire() as conn:
            items = await reviewer_store.review_queue(
                conn, None if tenants is None else sorted(tenants))
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse({"reviewer": visitor.principal.decider, "items": items},
                                headers=SECURITY_HEADERS)
        return _page("review queue", render_queue(visitor.principal, items,
                                                  self.auth.csrf_token(visitor)))

    async def _card(self, request: Request, desk: asyncpg.Pool, work: Runner,
                    visitor: Visitor, workflow_id: str, *,
                    answer: tuple[bool, str] | None = None, status: int = 200) -> Response:
        # The store's facts on a connection given back at once; the tenant check before any
        # work on the message, which waits for a work child without holding a connection.
        # The desk's pool: the planner's dry run reads contacts, which the ledger's role
        # may not (inboxcrm.store.roles).
        async with desk.acquire() as conn:
            facts = await card_facts(conn, workflow_id)
        if facts is None or not visitor.principal.may_see(facts.card.tenant):
            return _not_found()
        await read_message(facts, work)
        card = facts.card
        if "application/json" in request.headers.get("accept", ""):
            data: dict[str, Any] = dataclasses.asdict(card)
            if answer is not None:
                data["answer"] = {"accepted": answer[0], "message": answer[1]}
            return JSONResponse(data, status_code=status, headers=SECURITY_HEADERS)
        forms = DeskForms(self.auth.csrf_token(visitor), visitor.principal,
                          enabled=self.auth.decision_secret is not None)
        return _page(f"review {card.workflow_id}", render_html(card, forms, answer), status)


def review_router(settings: Settings) -> APIRouter:
    return ReviewDesk(settings).router()


@dataclasses.dataclass
class DeskForms:
    """What the decision forms need: the CSRF token, who decides, and whether the desk can
    decide at all (a relay without INBOXCRM_DECISION_SECRET is read-only)."""

    csrf: str
    principal: Principal
    enabled: bool


def _rows(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _signed_in(principal: Principal, csrf: str) -> str:
    scope = "all tenants" if principal.tenants is None else ", ".join(sorted(principal.tenants))
    return (f"<p id='who'>Signed in as <b>{escape(principal.decider)}</b> ({escape(scope)}) · "
            "<a href='/review/'>queue</a> "
            "<form method='post' action='/review/logout' style='display:inline'>"
            f"<input type='hidden' name='csrf' value='{escape(csrf, quote=True)}'>"
            "<button type='submit'>Sign out</button></form></p>")


def render_queue(principal: Principal, items: list[dict[str, Any]], csrf: str) -> str:
    """The reviewer's queue, oldest first: age, tenant, state, reason, wait, owner."""
    parts = ["<h1>Review queue</h1>", _signed_in(principal, csrf)]
    if not items:
        parts.append("<p id='queue'>Nothing waits for you.</p>")
        return "".join(parts)
    rows = []
    for item in items:
        link = (f"<a href='{escape(_card_path(item['workflow_id']), quote=True)}'>"
                f"{escape(item['workflow_id'])}</a>")
        cells = [escape(age_text(item["age_seconds"])), escape(item["tenant"]),
                 escape(item["state"]), escape(item["reason"]), escape(item["wait_id"] or ""),
                 escape(item["owner"]), "OVERDUE" if item["overdue"] else "", link]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("age", "tenant", "state", "reason", "wait",
                                             "owner", "overdue", "item"))
    parts.append(f"<table id='queue'><tr>{head}</tr>{''.join(rows)}</table>")
    return "".join(parts)


WHAT = {
    "approve": "Approve: continue (a follow-up wait: send this follow-up)",
    "hold": "Hold: keep it parked in the queue (the escalation time does not move)",
    "reject": "Reject: end it; nothing more is written or sent",
    "retry": "Retry: run the step again with the same operation key",
    "resolve": "Resolve: the side effect exists; record the evidence and continue",
    "send_again": ("Send again: a new follow-up with its own idempotency key (the customer "
                   "may get two); say why below"),
}


def _input(name: str, label: str, value: str = "", required: bool = False,
           kind: str = "text") -> str:
    need = " required" if required else ""
    return (f"<label>{escape(label)} <input type='{kind}' name='{name}' "
            f"value='{escape(value, quote=True)}' maxlength='{MAX_FIELD_CHARS}'{need}></label>")


def _decision_forms(card: ReviewCard, forms: DeskForms) -> str:
    """One POST form per decision the open wait allows, bound to its wait ID."""
    if not card.decisions or not card.wait_id:
        return "<p>None.</p>"
    if not forms.enabled:
        return ("<p>This desk is read-only (the relay has no INBOXCRM_DECISION_SECRET). "
                "Bodies for the Temporal UI's \"Send an Update\":</p><ul id='decisions'>"
                + "".join(f"<li><b>{escape(d.action)}</b>: <code>{escape(json.dumps(d.body))}"
                          "</code></li>" for d in card.decisions) + "</ul>")
    kind = card.wait_id.rsplit("-", 1)[-1]
    parts = [f"<p>Each decision answers wait <code>{escape(card.wait_id)}</code> only. It is "
             f"recorded as <b>{escape(forms.principal.decider)}</b>; the name below is a "
             "label.</p><div id='decisions'>"]
    for option in card.decisions:
        action = option.action
        fields = [f"<input type='hidden' name='{n}' value='{escape(v, quote=True)}'>"
                  for n, v in (("csrf", forms.csrf), ("action", action),
                               ("wait_id", card.wait_id))]
        fields.append(f"<p><b>{escape(WHAT.get(action, action))}</b></p>")
        fields.append(_input("reviewer", "Your name (label)", forms.principal.name))
        if action == "approve":
            if kind == "review":
                needs_sender = "corrections" in option.body
                fields.append(_input("sender_email", "Sender email" + (
                    " (required: the message gives none)" if needs_sender else
                    " (correction, optional)"), required=needs_sender, kind="email"))
                fields.append(_input("name", "Name (correction, optional)"))
                fields.append(_input("company", "Company (correction, optional)"))
            f = card.followup
            if kind == "followup" and f is not None and f.editable:
                # The follow-up as it will be sent; edited, the approval binds this text.
                fields.append(
                    f"<input type='hidden' name='rendered_sha256' "
                    f"value='{draft_sha256(f.body)}'>"
                    f"<input type='hidden' name='intent_id' "
                    f"value='{escape(f.intent_id or '', quote=True)}'>"
                    f"<label>Follow-up text (edit within the limits: at most {f.max_chars} "
                    f"characters; keep {escape(', '.join(f.keep))} exactly as written)"
                    f"<br><textarea name='draft' id='draft' rows='14' cols='90' "
                    f"maxlength='{f.max_chars}'>{escape(f.draft or f.body)}</textarea>"
                    "</label>")
            fields.append("<label>Follow-up <select name='send_followup'>"
                          "<option value='yes' selected>send it</option>"
                          "<option value='no'>continue without it</option></select></label>")
        if action == "resolve":
            fields.append(_input("evidence", "Evidence (CRM record ID or provider message ID)",
                                 required=True))
        if action == "send_again":
            fields.append(_input("note", "Why send it again (required, recorded with the "
                                 "approval)", required=True))
        else:
            fields.append(f"<label>Note <input type='text' name='note' "
                          f"maxlength='{MAX_FIELD_CHARS}'></label>")
        label = "Send again" if action == "send_again" else action.capitalize()
        fields.append(f"<button type='submit'>{escape(label)}</button>")
        parts.append(f"<form class='decision' id='decide-{escape(action)}' method='post' "
                     f"action='{escape(_card_path(card.workflow_id), quote=True)}'>"
                     + "".join(fields) + "</form>")
    parts.append("</div>")
    return "".join(parts)


def render_html(card: ReviewCard, forms: DeskForms | None = None,
                answer: tuple[bool, str] | None = None) -> str:
    """The card as HTML (every value escaped; marked lines in <mark>), with the decision
    forms and the workflow's answer to the last one."""
    parts = []
    if forms is not None:
        parts.append(_signed_in(forms.principal, forms.csrf))
    if answer is not None:
        accepted, message = answer
        parts.append(f"<p id='answer' class='answer {'accepted' if accepted else 'refused'}'>"
                     f"{escape(message)}</p>")
    parts += [f"<h1>Review card: <code>{escape(card.workflow_id)}</code></h1>",
              f"<p>tenant <b>{escape(card.tenant)}</b> · source {escape(card.source)} · "
              f"mailbox {escape(card.mailbox)} · state <b>{escape(card.state)}</b>"
              + (f" ({escape(card.reason)})" if card.reason else "") + "</p>"]
    if card.waiting:
        parts.append(f"<p id='wait'>Open wait <code>{escape(card.wait_id or '?')}</code>: "
                     f"<b>{escape(card.wait_reason or '')}</b> · owner "
                     f"{escape(card.owner or '')} · escalates at "
                     f"{escape(card.escalate_at or '')}"
                     + (" <b>OVERDUE</b>" if card.overdue else "") + "</p>")
    else:
        parts.append("<p id='wait'>No open wait: nothing to decide.</p>")
    parts.append(f"<p>Review reasons: {escape(', '.join(card.reasons) or 'none')}</p>")
    parts.append("<h2>Message (minimised)</h2>")
    parts.append(_rows([(n, v) for n, v in card.headers], ("header", "value")))
    lines = []
    for line in card.lines:
        text = escape(line.text)
        if line.marks:
            text = (f"<mark>{text}</mark> <span class='tag'>[{escape(', '.join(line.marks))}]"
                    "</span>")
        lines.append(text)
    parts.append("<pre id='message'>" + "\n".join(lines)
                 + ("\n… (truncated)" if card.truncated else "") + "</pre>")
    parts.append(f"<h2>Extracted fields</h2><p>intent <b>{escape(card.intent or '')}</b></p>")
    parts.append(_rows([(f.name, f.value or "", f"{f.confidence:.2f}", f.evidence or "")
                        for f in card.fields], ("field", "value", "confidence", "evidence")))
    parts.append("<h2>Candidate contacts</h2>")
    parts.append(_rows([(c.contact, c.email, c.name or "", c.company or "", c.why)
                        for c in card.candidates],
                       ("contact", "email", "name", "company", "why it matches"))
                 if card.candidates else "<p>None: a new contact would be created.</p>")
    parts.append("<h2>Consent and suppression</h2><ul>"
                 + "".join(f"<li>{escape(c)}</li>" for c in card.consent) + "</ul>")
    parts.append("<h2>Proposed follow-up</h2>")
    if card.followup is None:
        parts.append("<p>None (no rule for this intent).</p>")
    else:
        f = card.followup
        parts.append(f"<p>rule {escape(f.rule)} · template {escape(f.template_id)} · to "
                     f"<b>{escape(f.recipient or '(unknown)')}</b> · {escape(f.status)}</p>"
                     f"<pre id='followup'>Subject: {escape(f.subject)}\n\n{escape(f.body)}</pre>")
    if card.operations:
        parts.append("<h2>Operations</h2>")
        parts.append(_rows([(o.action, o.status, o.attempts, o.error or "")
                            for o in card.operations],
                           ("operation", "status", "attempts", "destination error")))
    if card.ambiguous is not None:
        amb = card.ambiguous
        parts.append("<h2>Ambiguous: check the destination before deciding</h2>"
                     "<dl id='ambiguous'>" + "".join(
                         f"<dt>{escape(k)}</dt><dd><code>{escape(v or '')}</code></dd>"
                         for k, v in (("operation key", amb.op_key),
                                      ("intent ID (idempotency key)", amb.intent_id),
                                      ("first attempt", amb.first_attempt_at),
                                      ("key window from", amb.key_window_from),
                                      ("lookup", amb.lookup))) + "</dl>"
                     f"<p class='warning'><b>Warning:</b> {escape(amb.warning)}</p>"
                     + (f"<p>retry and send again need the reviewer role "
                        f"<b>{escape(amb.retry_role)}</b> (tenant policy)</p>"
                        if amb.retry_role else ""))
    parts.append("<h2>Decisions allowed now</h2>")
    if forms is None:
        parts.append("<ul id='decisions'>" + "".join(
            f"<li><b>{escape(d.action)}</b>: <code>{escape(json.dumps(d.body))}</code></li>"
            for d in card.decisions) + "</ul>" if card.decisions else "<p>None.</p>")
    else:
        parts.append(_decision_forms(card, forms))
    return "".join(parts)
