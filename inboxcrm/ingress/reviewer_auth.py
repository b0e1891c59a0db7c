"""Who is at the review desk (docs/architecture.md §7): the operator's all-tenant token
(`INBOXCRM_REVIEW_TOKEN`), a reviewer's personal token, or an access token of the
organisation's OIDC issuer, each as `Authorization: Bearer …`; or a session cookie that the
desk's login form issues for the first two.

Sessions are server-side (`review_sessions`, migration 069): the cookie is a random session ID
(32 bytes), of which the store keeps only the SHA-256, with who signed in (`op` or
`r<reviewer_id>`). Each request checks and touches the row in one statement: signing out
ends it (a replayed cookie is refused), so does `INBOXCRM_REVIEW_SESSION_IDLE_MINUTES` without
a request (default 30) and `INBOXCRM_REVIEW_SESSION_HOURS` after sign-in (default 12). An
operator session is bound to an HMAC of the operator token that signed it in, so a relay
started with a rotated `INBOXCRM_REVIEW_TOKEN` refuses the old sessions; a reviewer's is
checked against the store on every request, so `inboxcrm reviewer revoke` (and `rotate`,
which makes a new reviewer row) ends it at once. Every
state-changing request must come from our own pages: a browser's `Sec-Fetch-Site` must say
same-origin, an `Origin` must be ours, and the form must carry the CSRF token bound to the
credential that signed it in (the session, or the bearer token's hash)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from fastapi import Request

from inboxcrm.platform import oidc
from inboxcrm.platform.reviewer_identity import (
    Principal,
    derived_key,
    operator,
    token_digest,
)
from inboxcrm.store import review_sessions
from inboxcrm.store import reviewers as store

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings
    from inboxcrm.store.db import Conn

COOKIE = "inboxcrm_review"
# What a session ID looks like in a cookie: `secrets.token_urlsafe(32)`.
_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{43}$")


@dataclass(frozen=True)
class Visitor:
    """An authenticated request: who, and what its CSRF token is bound to."""

    principal: Principal
    binding: str


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


class DeskAuth:
    def __init__(self, settings: Settings) -> None:
        self._operator_token = (settings.review_token.get_secret_value()
                                if settings.review_token else None)
        secret = settings.decision_secret.get_secret_value() if settings.decision_secret \
            else None
        self.decision_secret = secret
        # Sessions and CSRF tokens are keyed by the server-side secret; without one, by the
        # operator token (as before reviewers existed), else by a key of this process only.
        base = secret or self._operator_token or secrets.token_urlsafe(32)
        self._session_key = derived_key(base, "review-session")
        self._csrf_key = derived_key(base, "review-csrf")
        self._seconds = int(settings.review_session_hours * 3600)
        self._idle_seconds = settings.review_session_idle_minutes * 60
        # What an operator session is bound to: this operator token (a rotated one, another).
        self._operator_binding = (
            hmac.new(self._session_key, b"operator-token\n" + self._operator_token.encode(),
                     hashlib.sha256).hexdigest() if self._operator_token else None)
        self._public_origin = _origin(settings.public_relay_base_url)
        self.verifier = oidc.verifier_from(settings.oidc_issuer, settings.oidc_audience,
                                           settings.oidc_tenants_claim,
                                           settings.oidc_jwks_cache_seconds)

    # --- credentials -------------------------------------------------------------------
    async def from_token(self, conn: Conn, token: str) -> Principal | None:
        """The operator, a reviewer (personal token) or an SSO user (JWT), or None."""
        token = token.strip()
        if not token:
            return None
        if self._operator_token and hmac.compare_digest(token.encode(),
                                                        self._operator_token.encode()):
            return operator()
        if self.verifier is not None and oidc.looks_like_jwt(token):
            try:
                return await self.verifier.principal(token)
            except oidc.TokenRefused:
                return None
        row = await store.active_by_token(conn, token_digest(token))
        if row is None:
            return None
        return Principal(f"reviewer:{row['name']}", row["name"], frozenset(row["tenants"]),
                         reviewer_id=row["reviewer_id"], role=row["role"])

    async def visitor(self, request: Request, conn: Conn) -> Visitor | None:
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and credential.strip():
            principal = await self.from_token(conn, credential)
            if principal is None:
                return None
            digest = hashlib.sha256(credential.strip().encode()).hexdigest()
            return Visitor(principal, f"bearer:{digest}")
        value = request.cookies.get(COOKIE)
        principal = await self._from_session(conn, value)
        return None if principal is None or value is None else Visitor(principal,
                                                                         f"session:{value}")

    # --- sessions ------------------------------------------------------------------------
    async def start_session(self, conn: Conn, principal: Principal) -> tuple[str, int] | None:
        """A session for the operator or a personal-token reviewer (an SSO user keeps
        sending their bearer token): the cookie's value and its lifetime in seconds."""
        if principal.reviewer_id is not None:
            who, credential = f"r{principal.reviewer_id}", ""
        elif principal.decider == operator().decider and self._operator_binding:
            who, credential = "op", self._operator_binding
        else:
            return None
        value = secrets.token_urlsafe(32)
        await review_sessions.start_session(conn, session_sha256=_digest(value), who=who,
                                            credential=credential, seconds=self._seconds)
        return value, self._seconds

    async def end_session(self, conn: Conn, value: str | None) -> None:
        """Sign-out: the session ends for good, wherever its cookie is replayed."""
        if value and _SESSION_ID.match(value):
            await review_sessions.end_session(conn, session_sha256=_digest(value))

    async def _from_session(self, conn: Conn, value: str | None) -> Principal | None:
        if not value or not _SESSION_ID.match(value):
            return None
        live = await review_sessions.touch_session(conn, session_sha256=_digest(value),
                                                   idle_seconds=self._idle_seconds)
        if live is None:
            return None
        who, credential = live
        if who == "op":
            bound = self._operator_binding
            return operator() if bound and hmac.compare_digest(
                credential.encode(), bound.encode()) else None
        if who.startswith("r") and who[1:].isdigit():
            row = await store.active_by_id(conn, int(who[1:]))
            if row is not None:
                return Principal(f"reviewer:{row['name']}", row["name"],
                                 frozenset(row["tenants"]), reviewer_id=row["reviewer_id"],
                                 role=row["role"])
        return None

    # --- cross-site request forgery ------------------------------------------------------
    def csrf_token(self, visitor: Visitor) -> str:
        return hmac.new(self._csrf_key, visitor.binding.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, visitor: Visitor, presented: str) -> bool:
        return bool(presented) and hmac.compare_digest(presented.encode(),
                                                       self.csrf_token(visitor).encode())

    def cross_site(self, request: Request) -> bool:
        """A browser says where the request comes from: anything but our own pages is
        refused (a request without these headers is not a browser's; the CSRF token still
        has to match)."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site.lower() not in {"same-origin", "none"}:
            return True
        origin = request.headers.get("origin")
        if origin is None:
            return False
        own = {self._public_origin}
        host = request.headers.get("host")
        if host:
            own.add(f"{request.url.scheme}://{host}".lower())
        return origin.lower() not in own


def _digest(value: str) -> bytes:
    """What the store keeps of a session ID (high-entropy: a plain hash is enough)."""
    return hashlib.sha256(value.encode()).digest()
