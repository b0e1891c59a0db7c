"""The review card over HTTP: `GET /review/{workflow_id}` (the ID URL-encoded), linked from
the workflow's current details in the Temporal UI (docs/architecture.md §6, §10).

Access: `Authorization: Bearer $INBOXCRM_REVIEW_TOKEN`, or a session cookie from the small
login form at `/review/login` (the token in a POST body, never in a URL); 401 otherwise. The
token is one operator token, not scoped to a tenant. The card is read-only (no buttons, no
state-changing request), so there is nothing to forge; decisions go through Temporal. No
personal data in URLs (workflow IDs hold the tenant's own mailbox and the provider's
delivery ID), logs or metrics; responses are `no-store`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import time
from html import escape
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from inboxcrm.domain.review_card import ReviewCard, build_card
from inboxcrm.ingress.intake import Ingestor
from inboxcrm.platform.config import Settings

COOKIE = "inboxcrm_review"
MAX_LOGIN_BYTES = 4096
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
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
"""


class Sessions:
    """Signed, expiring session values: `expiry.hmac(token, expiry)`; no server state."""

    def __init__(self, token: str | None, hours: float) -> None:
        self._token = token
        self._seconds = int(hours * 3600)

    @property
    def enabled(self) -> bool:
        return bool(self._token)

    def _sign(self, expiry: int) -> str:
        assert self._token is not None
        return hmac.new(self._token.encode(), f"review-session.{expiry}".encode(),
                        hashlib.sha256).hexdigest()

    def token_ok(self, candidate: str) -> bool:
        return self._token is not None and hmac.compare_digest(
            candidate.encode(), self._token.encode())

    def issue(self) -> tuple[str, int]:
        expiry = int(time.time()) + self._seconds
        return f"{expiry}.{self._sign(expiry)}", self._seconds

    def valid(self, value: str | None) -> bool:
        if not self._token or not value:
            return False
        expiry, _, signature = value.partition(".")
        if not expiry.isdigit() or int(expiry) < time.time():
            return False
        return hmac.compare_digest(signature.encode(), self._sign(int(expiry)).encode())

    def authorised(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        if scheme.lower() == "bearer" and self.token_ok(credential.strip()):
            return True
        return self.valid(request.cookies.get(COOKIE))


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    html = (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def _login_form(next_path: str, message: str = "", status: int = 200) -> HTMLResponse:
    note = f"<p><strong>{escape(message)}</strong></p>" if message else ""
    return _page("inboxcrm review: sign in", (
        "<h1>inboxcrm review desk</h1>" + note +
        "<p>Paste the review token (<code>INBOXCRM_REVIEW_TOKEN</code> in "
        "<code>.data/stack.env</code>).</p>"
        "<form method='post' action='/review/login'>"
        f"<input type='hidden' name='next' value='{escape(next_path, quote=True)}'>"
        "<label>Review token <input type='password' name='token' autocomplete='off'></label> "
        "<button type='submit'>Sign in</button></form>"), status)


def _safe_next(value: str | None) -> str:
    """Only a card on this relay: never an open redirect."""
    if value and value.startswith("/review/") and not value.startswith("//") and (
            "\\" not in value):
        return value
    return "/review/login"


def review_router(settings: Settings) -> APIRouter:
    router = APIRouter()
    token = settings.review_token.get_secret_value() if settings.review_token else None
    sessions = Sessions(token, settings.review_session_hours)

    @router.get("/review/login")
    async def login_form(request: Request) -> HTMLResponse:
        return _login_form(_safe_next(request.query_params.get("next")))

    @router.post("/review/login", response_model=None)
    async def login(request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_LOGIN_BYTES:
            return _login_form("/review/login", "request too large", 413)
        form = parse_qs(body.decode("utf-8", "replace"))
        next_path = _safe_next((form.get("next") or [""])[0])
        if not sessions.token_ok((form.get("token") or [""])[0]):
            return _login_form(next_path, "wrong or missing token", 401)
        value, max_age = sessions.issue()
        response = RedirectResponse(next_path if next_path != "/review/login" else "/review/",
                                    status_code=303, headers={"Cache-Control": "no-store"})
        response.set_cookie(COOKIE, value, max_age=max_age, path="/review", httponly=True,
                            samesite="lax", secure=request.url.scheme == "https")
        return response

    @router.get("/review/{workflow_id:path}", response_model=None)
    async def review_card(workflow_id: str, request: Request) -> Response:
        if not sessions.authorised(request):
            target = "/review/" + quote(workflow_id, safe="")
            return _login_form(target, "sign in to see this review card" if sessions.enabled
                               else "the review card is off (INBOXCRM_REVIEW_TOKEN unset)",
                               401)
        if not workflow_id:
            return _page("inboxcrm review", "<p>Open a card from its link in the Temporal UI "
                         "or with <code>inboxcrm review show WORKFLOW_ID</code>.</p>")
        ingestor: Ingestor = request.app.state.ingestor
        async with ingestor.pool.acquire() as conn:
            card = await build_card(conn, workflow_id, request.app.state.work)
        if card is None:
            return _page("not found", "<p>No item with this workflow ID.</p>", 404)
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse(dataclasses.asdict(card), headers=SECURITY_HEADERS)
        return _page(f"review {card.workflow_id}", render_html(card))

    return router


def _rows(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(card: ReviewCard) -> str:
    """The card as HTML (every value escaped; marked lines in <mark>)."""
    parts = [f"<h1>Review card: <code>{escape(card.workflow_id)}</code></h1>",
             f"<p>tenant <b>{escape(card.tenant)}</b> · source {escape(card.source)} · mailbox "
             f"{escape(card.mailbox)} · state <b>{escape(card.state)}</b>"
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
    parts.append("<h2>Decisions allowed now</h2>")
    if card.decisions:
        parts.append("<p>In the Temporal UI: More Actions → \"Send an Update\" (or \"Send a "
                     "Signal\"), or <code>inboxcrm review ACTION WORKFLOW_ID --reviewer NAME"
                     "</code>. Bodies:</p><ul id='decisions'>" + "".join(
                         f"<li><b>{escape(d.action)}</b>: <code>{escape(json.dumps(d.body))}"
                         "</code></li>" for d in card.decisions) + "</ul>")
    else:
        parts.append("<p>None.</p>")
    return "".join(parts)
