"""Access tokens from the organisation's OIDC issuer (docs/architecture.md §7): the signed-in
person's JWT, as the Temporal UI passes it to the codec endpoint (`passAccessToken`) and as a
sign-on proxy passes it to the review desk.

A token counts only if it is signed by one of the keys the issuer publishes (its JWKS, found
through `{issuer}/.well-known/openid-configuration`, cached for `INBOXCRM_OIDC_JWKS_CACHE_SECONDS`
and fetched again at most once a minute for an unknown key ID), with an asymmetric algorithm,
for our audience, from that issuer (with or without a trailing `/`, as issuers write it),
not expired, typed as a JWT or an access token (`at+jwt`, RFC 9068), and, when it names
several audiences, authorised for ours (`azp`, OpenID Connect Core 3.1.3.7). A failed key
fetch is not retried for a minute, so a down issuer does not put a five-second wait in front
of every request. The tenants a person may review come from
one claim (`INBOXCRM_OIDC_TENANTS_CLAIM`: a list, or a space- or comma-separated string).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from inboxcrm.platform.reviewer_identity import Principal

# Asymmetric only: a symmetric (HS*) or unsigned token could be made by anyone who knows the
# issuer's public keys.
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
              "ES512", "EdDSA"]
LEEWAY_SECONDS = 30
FETCH_TIMEOUT_SECONDS = 5.0
REFETCH_INTERVAL_SECONDS = 60.0
MAX_TOKEN_CHARS = 16 * 1024
# The JOSE `typ` of a JWT access token (RFC 9068 §2.1) or of a plain JWT; anything else (a
# logout token, an encrypted or nested token) is not a person's access token.
TOKEN_TYPES = {"jwt", "at+jwt", "application/at+jwt"}


class TokenRefused(Exception):
    """The token does not prove anything here; the message is a reason, never the token."""


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and len(token) <= MAX_TOKEN_CHARS


def tenants_of(claims: dict[str, Any], claim: str) -> frozenset[str]:
    value = claims.get(claim)
    if isinstance(value, str):
        items = value.replace(",", " ").split()
    elif isinstance(value, list):
        items = [v for v in value if isinstance(v, str)]
    else:
        items = []
    return frozenset(item.strip() for item in items if item.strip())


def principal_of(claims: dict[str, Any], tenants_claim: str) -> Principal:
    """The person a verified token names: recorded as `oidc:<email | preferred_username |
    sub>`, limited to the tenants in the claim. An email counts only when the issuer says it
    verified it (`email_verified`): otherwise anyone who may set their own address at the
    issuer could sign decisions under a colleague's."""
    email = claims.get("email") if claims.get("email_verified") is True else None
    who = next((str(value) for value in (email, claims.get("preferred_username"),
                                         claims.get("sub"))
                if isinstance(value, str) and value), "unknown")
    return Principal(f"oidc:{who}"[:200], who[:200], tenants_of(claims, tenants_claim))


@dataclass
class _Keys:
    by_kid: dict[str, jwt.PyJWK]
    fetched_at: float


class OidcVerifier:
    """Verifies access tokens of one issuer for one audience. One per process; safe to share
    between requests (the key set is replaced whole)."""

    def __init__(self, issuer: str, audience: str, tenants_claim: str,
                 cache_seconds: float = 600.0) -> None:
        self.issuer = issuer.rstrip("/")
        self.audience = audience
        self.tenants_claim = tenants_claim
        self._cache_seconds = cache_seconds
        self._keys: _Keys | None = None
        self._failed_at: float | None = None  # when the last fetch failed
        self._lock = asyncio.Lock()

    async def _fetch_keys(self) -> _Keys:
        async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_SECONDS,
                                     follow_redirects=False) as http:
            discovery = (await http.get(
                f"{self.issuer}/.well-known/openid-configuration")).raise_for_status().json()
            if str(discovery.get("issuer", "")).rstrip("/") != self.issuer:
                raise TokenRefused("the discovery document names another issuer")
            jwks_uri = discovery.get("jwks_uri")
            if not isinstance(jwks_uri, str):
                raise TokenRefused("the discovery document has no jwks_uri")
            keyset = (await http.get(jwks_uri)).raise_for_status().json()
        by_kid: dict[str, jwt.PyJWK] = {}
        for entry in keyset.get("keys", []):
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(entry)
            except (jwt.PyJWKError, jwt.InvalidKeyError):
                continue
            by_kid[str(entry.get("kid", ""))] = key
        return _Keys(by_kid, time.monotonic())

    async def _key_for(self, kid: str) -> jwt.PyJWK:
        async with self._lock:
            now = time.monotonic()
            keys = self._keys
            stale = keys is None or now - keys.fetched_at > self._cache_seconds
            unknown = keys is not None and kid not in keys.by_kid and (
                now - keys.fetched_at > REFETCH_INTERVAL_SECONDS)
            may_fetch = self._failed_at is None or (
                now - self._failed_at >= REFETCH_INTERVAL_SECONDS)
            if (stale or unknown) and may_fetch:
                try:
                    self._keys = keys = await self._fetch_keys()
                    self._failed_at = None
                except (httpx.HTTPError, ValueError, TokenRefused) as exc:
                    # Keep the keys we have; ask again only after the interval.
                    self._failed_at = now
                    if keys is None:
                        raise TokenRefused(f"issuer keys unavailable ({type(exc).__name__})"
                                           ) from exc
            if keys is None:
                raise TokenRefused("issuer keys unavailable (the last fetch failed)")
        key = keys.by_kid.get(kid)
        if key is None and not kid and len(keys.by_kid) == 1:
            key = next(iter(keys.by_kid.values()))
        if key is None:
            raise TokenRefused("signed with a key the issuer does not publish")
        return key

    async def verify(self, token: str) -> dict[str, Any]:
        """The token's claims, or TokenRefused with the reason."""
        if not looks_like_jwt(token):
            raise TokenRefused("not a JWT")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenRefused("malformed token") from exc
        if header.get("alg") not in ALGORITHMS:
            raise TokenRefused("algorithm not accepted")
        if str(header.get("typ", "JWT")).lower() not in TOKEN_TYPES:
            raise TokenRefused("not an access token (typ)")
        key = await self._key_for(str(header.get("kid", "")))
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key=key, algorithms=ALGORITHMS, audience=self.audience,
                issuer=[self.issuer, f"{self.issuer}/"], leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError as exc:
            raise TokenRefused("expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise TokenRefused("wrong audience") from exc
        except jwt.InvalidIssuerError as exc:
            raise TokenRefused("wrong issuer") from exc
        except jwt.InvalidSignatureError as exc:
            raise TokenRefused("bad signature") from exc
        except jwt.PyJWTError as exc:
            raise TokenRefused(f"invalid token ({type(exc).__name__})") from exc
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != self.audience:
            raise TokenRefused("not authorised for this audience (azp)")
        return claims

    async def principal(self, token: str) -> Principal:
        return principal_of(await self.verify(token), self.tenants_claim)


def verifier_from(issuer: str | None, audience: str | None, tenants_claim: str,
                  cache_seconds: float) -> OidcVerifier | None:
    """None unless both the issuer and the audience are configured."""
    if not issuer or not audience:
        return None
    return OidcVerifier(issuer, audience, tenants_claim, cache_seconds)
