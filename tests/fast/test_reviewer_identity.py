"""Who decided, and who may decode (docs/architecture.md §6, §7), without a stack: the
decision proof, the OIDC verifier against a local test issuer (an RSA key made here, its
discovery document and JWKS over loopback HTTP), and the codec endpoint's credentials."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from fastapi import FastAPI, Request
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from inboxcrm.ingress.codec import codec_router
from inboxcrm.ingress.reviewer_auth import DeskAuth, Visitor
from inboxcrm.platform import oidc
from inboxcrm.platform.codec import EncryptionCodec, Keyring, ensure_key_file, load_keyring
from inboxcrm.platform.config import Settings
from inboxcrm.platform.reviewer_identity import (
    DecisionClaim,
    derived_key,
    new_token,
    operator,
    sign_decision,
    token_digest,
    verify_decision,
)
from tests.helpers.oidc_issuer import AUDIENCE, TENANTS_CLAIM, LocalIssuer, rsa_key, serve_issuer

SECRET = "server-side-secret-of-32-bytes-or-more"
OPERATOR_TOKEN = "operator-token-of-32-bytes-or-more"  # 32+ bytes outside local
WF = "inbound/acme/standard/sales@acme.test/E-1"


def test_a_proof_holds_only_for_exactly_what_it_signed() -> None:
    """The proof covers the whole decision: who, the path, the workflow, the wait, the
    action and every field of the body (issue 36: a desk proof sent again with other
    corrections proves nothing)."""
    claim = DecisionClaim("reviewer:dana", "desk", WF, "w1-review", "approve",
                          reviewer="dana", note="checked", evidence=None,
                          corrections={"sender_email": "a@b.test"}, send_followup=True)
    proof = sign_decision(SECRET, claim)
    assert proof.startswith("v2:") and verify_decision(SECRET, proof, claim)
    for change in ({"decider": "reviewer:erin"}, {"path": "cli"}, {"workflow_id": WF + "x"},
                   {"wait_id": "w2-followup"}, {"action": "reject"}, {"reviewer": "erin"},
                   {"note": "other"}, {"note": None}, {"evidence": "crm-1"},
                   {"corrections": {"sender_email": "evil@b.test"}}, {"corrections": {}},
                   {"corrections": {"sender_email": "a@b.test", "company": "X"}},
                   {"send_followup": False}):
        assert not verify_decision(SECRET, proof, dataclasses.replace(claim, **change)), change
    # The same decision, its corrections in another order, is the same message.
    reordered = dataclasses.replace(claim, corrections={"company": "X", "sender_email": "a"})
    assert verify_decision(SECRET, sign_decision(SECRET, reordered), dataclasses.replace(
        claim, corrections={"sender_email": "a", "company": "X"}))
    assert not verify_decision("another-secret", proof, claim)
    assert not verify_decision(None, proof, claim)
    # A proof of the format before (decider, path, workflow, wait and action only) proves
    # nothing: its body could be anything.
    legacy = hmac.new(derived_key(SECRET, "decision-proof"), "\n".join(
        ("inboxcrm-decision.v1", "reviewer:dana", "desk", WF, "w1-review", "approve")
    ).encode(), hashlib.sha256).hexdigest()
    assert not verify_decision(SECRET, legacy, claim)
    # Only the desk and the CLI sign: a Temporal UI path cannot be "proven".
    ui = dataclasses.replace(claim, path="temporal-ui signal", action="hold")
    assert not verify_decision(SECRET, sign_decision(SECRET, ui), ui)


def test_personal_tokens_are_random_and_stored_as_their_hash() -> None:
    first, second = new_token(), new_token()
    assert first != second and len(first) > 40
    assert token_digest(first) == token_digest(f" {first}\n") and len(token_digest(first)) == 32


@pytest.fixture(scope="module")
def issuer() -> Iterator[LocalIssuer]:
    with serve_issuer() as running:
        yield running


async def test_the_verifier_accepts_the_issuers_tokens_only(issuer: LocalIssuer) -> None:
    verifier = oidc.OidcVerifier(issuer.url, AUDIENCE, TENANTS_CLAIM)
    principal = await verifier.principal(issuer.token(tenants=["acme", "globex"]))
    assert principal.decider == "oidc:dana@example.test"
    assert principal.tenants == frozenset({"acme", "globex"})
    assert principal.may_see("acme") and not principal.may_see("initech")

    refused = {
        "expired": issuer.token(expires_in=-120),
        "bad signature": issuer.token(key=rsa_key()),
        "wrong audience": issuer.token(audience="someone-else"),
        "wrong issuer": issuer.token(issuer="http://127.0.0.1:1/other"),
    }
    for reason, token in refused.items():
        with pytest.raises(oidc.TokenRefused, match=reason):
            await verifier.verify(token)
    # A symmetric token "signed" with the public key, or an unsigned one, never counts.
    public_pem = issuer.key.public_key().public_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PublicFormat.SubjectPublicKeyInfo)
    hs = jwt.encode({"iss": issuer.url, "aud": AUDIENCE, "exp": 2**33}, public_pem[:64],
                    algorithm="HS256")
    with pytest.raises(oidc.TokenRefused, match="algorithm"):
        await verifier.verify(hs)
    header = base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode()
    body = base64.urlsafe_b64encode(json.dumps(
        {"iss": issuer.url, "aud": AUDIENCE, "exp": 2**33}).encode()).rstrip(b"=").decode()
    with pytest.raises(oidc.TokenRefused, match="algorithm"):
        await verifier.verify(f"{header}.{body}.")
    # The key set was fetched once through the discovery document and then cached.
    assert issuer.fetches.count("/.well-known/openid-configuration") == 1


async def test_the_verifier_holds_the_rest_of_the_oidc_rules(issuer: LocalIssuer) -> None:
    """An unverified email names nobody; an issuer written with a trailing `/` is the same
    issuer; a token that is not an access token, or that names several audiences without
    being authorised for ours, proves nothing."""
    verifier = oidc.OidcVerifier(issuer.url, AUDIENCE, TENANTS_CLAIM)
    unverified = await verifier.principal(issuer.token(email_verified=False))
    assert unverified.decider == "oidc:u-1"  # the subject, not the address the person typed
    named = await verifier.principal(issuer.token(email_verified=False,
                                                  preferred_username="dana"))
    assert named.decider == "oidc:dana"
    slashed = await verifier.verify(issuer.token(issuer=f"{issuer.url}/"))
    assert slashed["iss"] == f"{issuer.url}/"
    configured_with_slash = oidc.OidcVerifier(f"{issuer.url}/", AUDIENCE, TENANTS_CLAIM)
    assert (await configured_with_slash.verify(issuer.token()))["aud"] == AUDIENCE
    with pytest.raises(oidc.TokenRefused, match="typ"):
        await verifier.verify(issuer.token(typ="logout+jwt"))
    assert await verifier.verify(issuer.token(typ="at+jwt"))
    several = [AUDIENCE, "another-app"]
    with pytest.raises(oidc.TokenRefused, match="azp"):
        await verifier.verify(issuer.token(audience=several))
    with pytest.raises(oidc.TokenRefused, match="azp"):
        await verifier.verify(issuer.token(audience=several,
                                           azp="another-app"))
    assert await verifier.verify(issuer.token(audience=several,
                                              azp=AUDIENCE))


async def test_a_failed_key_fetch_is_not_retried_on_every_request(issuer: LocalIssuer) -> None:
    """An issuer that cannot be read costs one fetch a minute, not one per request behind
    one lock."""
    broken = oidc.OidcVerifier(f"{issuer.url}/missing", AUDIENCE, TENANTS_CLAIM)
    before = len(issuer.fetches)
    for _ in range(5):
        with pytest.raises(oidc.TokenRefused, match="issuer keys unavailable"):
            await broken.verify(issuer.token())
    assert len(issuer.fetches) - before == 1


def test_tenants_come_from_a_list_or_a_string_claim() -> None:
    assert oidc.tenants_of({"t": ["acme", 3, " globex "]}, "t") == {"acme", "globex"}
    assert oidc.tenants_of({"t": "acme globex,initech"}, "t") == {"acme", "globex", "initech"}
    assert oidc.tenants_of({}, "t") == frozenset()


# --- the codec endpoint ------------------------------------------------------------------
STATIC_TOKEN = "static-codec-token-of-at-least-32-bytes"  # outside local, 32 bytes or more


@pytest.fixture
async def codec(issuer: LocalIssuer, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The relay's codec routes on a non-loopback address: a credential is always needed."""
    keys = tmp_path / "codec-keys.json"
    ensure_key_file(keys)
    env = {"INBOXCRM_RELAY_HOST": "0.0.0.0", "INBOXCRM_CODEC_KEYS_FILE": str(keys),
           "INBOXCRM_CODEC_TOKEN": STATIC_TOKEN, "INBOXCRM_OIDC_ISSUER": issuer.url,
           "INBOXCRM_OIDC_AUDIENCE": AUDIENCE}
    with mock.patch.dict("os.environ", env):
        settings = Settings()
    app = FastAPI()
    app.include_router(codec_router(settings))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://relay.test") as client:
        yield client


PLAIN = {"payloads": [{"metadata": {"encoding": base64.b64encode(b"json/plain").decode()},
                       "data": base64.b64encode(b'{"reviewer": "dana"}').decode()}]}


async def _roundtrip(codec: httpx.AsyncClient, token: str) -> tuple[int, int]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    encoded = await codec.post("/codec/encode", json=PLAIN, headers=headers)
    if encoded.status_code != 200:
        return encoded.status_code, encoded.status_code
    decoded = await codec.post("/codec/decode", content=encoded.content, headers=headers)
    if decoded.status_code == 200:
        assert decoded.json() == PLAIN
    return encoded.status_code, decoded.status_code


async def test_the_codec_decodes_for_the_issuers_access_token(
        codec: httpx.AsyncClient, issuer: LocalIssuer) -> None:
    assert await _roundtrip(codec, issuer.token(tenants=["acme"])) == (200, 200)
    assert await _roundtrip(codec, STATIC_TOKEN) == (200, 200)  # the local stack's


async def test_the_codec_refuses_expired_wrongly_signed_and_foreign_tokens(
        codec: httpx.AsyncClient, issuer: LocalIssuer) -> None:
    for token in (issuer.token(tenants=["acme"], expires_in=-120),
                  issuer.token(tenants=["acme"], key=rsa_key()),
                  issuer.token(tenants=["acme"], audience="another-app"),
                  "not-the-static-token"):
        assert await _roundtrip(codec, token) == (401, 401), token[:20]
    assert (await codec.post("/codec/decode", json=PLAIN)).status_code == 401
    # Signed in, but reviewing no tenant: no decoding.
    assert (await _roundtrip(codec, issuer.token()))[0] == 403


async def test_a_tenants_token_opens_only_its_tenants_payloads(
        codec: httpx.AsyncClient, issuer: LocalIssuer, tmp_path: Path) -> None:
    """Tenant A's reviewer cannot read tenant B's history through the codec: B's payloads come
    back still sealed; the static (operator) token opens both."""
    keys = EncryptionCodec(load_keyring(Settings(
        codec_keys_file=str(tmp_path / "codec-keys.json"))) or Keyring("x", {}))
    acme = await keys.for_tenant("acme").encode([Payload(data=b'{"acme": 1}')])
    globex = await keys.for_tenant("globex").encode([Payload(data=b'{"globex": 1}')])
    body = json_format.MessageToJson(Payloads(payloads=[*acme, *globex]))

    async def decoded(token: str) -> list[Payload]:
        response = await codec.post("/codec/decode", content=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        assert response.status_code == 200, response.text
        return list(json_format.Parse(response.text, Payloads()).payloads)

    mine, theirs = await decoded(issuer.token(tenants=["acme"]))
    assert mine.data == b'{"acme": 1}'
    assert theirs == globex[0] and b"globex" not in theirs.data
    assert [p.data for p in await decoded(STATIC_TOKEN)] == [b'{"acme": 1}', b'{"globex": 1}']
    # What an acme reviewer encodes in the UI is sealed for acme, and reads back.
    encoded = await codec.post("/codec/encode", json=PLAIN, headers={
        "Authorization": f"Bearer {issuer.token(tenants=['acme'])}"})
    sealed = json_format.Parse(encoded.text, Payloads()).payloads[0]
    assert sealed.metadata["encryption-tenant"] == b"acme"


# --- the desk's credentials and cross-site checks ------------------------------------------
def _desk(issuer: LocalIssuer) -> DeskAuth:
    env = {"INBOXCRM_REVIEW_TOKEN": OPERATOR_TOKEN, "INBOXCRM_DECISION_SECRET": SECRET,
           "INBOXCRM_OIDC_ISSUER": issuer.url, "INBOXCRM_OIDC_AUDIENCE": AUDIENCE,
           "INBOXCRM_PUBLIC_RELAY_URL": "https://relay.example.test"}
    with mock.patch.dict("os.environ", env):
        return DeskAuth(Settings())


def _request(method: str = "POST", **headers: str) -> Request:
    raw = [(k.lower().replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": method, "scheme": "http", "path": "/review/x",
                    "headers": [(b"host", b"127.0.0.1:8080"), *raw], "query_string": b"",
                    "server": ("127.0.0.1", 8080)})


async def test_the_desk_knows_the_operator_and_sso_users_by_their_tokens(
        issuer: LocalIssuer) -> None:
    desk = _desk(issuer)
    no_store: Any = None  # neither credential needs the store
    assert (await desk.from_token(no_store, OPERATOR_TOKEN)) == operator()
    sso = await desk.from_token(no_store, issuer.token(tenants=["globex"], email="gus@x.test"))
    assert sso is not None and sso.decider == "oidc:gus@x.test"
    assert sso.may_see("globex") and not sso.may_see("acme")
    for refused in (issuer.token(tenants=["globex"], expires_in=-120),
                    issuer.token(tenants=["globex"], key=rsa_key())):
        assert await desk.from_token(no_store, refused) is None
    # Sessions exist for the operator and personal-token reviewers (server-side:
    # tests/test_review_sessions.py), not for SSO users, who keep sending their token.
    assert await desk.start_session(no_store, sso) is None


def test_the_desk_refuses_cross_site_posts_and_foreign_csrf_tokens(issuer: LocalIssuer) -> None:
    desk = _desk(issuer)
    assert not desk.cross_site(_request())  # not a browser: the CSRF token decides
    assert not desk.cross_site(_request(Sec_Fetch_Site="same-origin",
                                        Origin="http://127.0.0.1:8080"))
    assert not desk.cross_site(_request(Origin="https://relay.example.test"))
    for headers in ({"Sec_Fetch_Site": "cross-site"}, {"Sec_Fetch_Site": "same-site"},
                    {"Origin": "https://evil.test"}, {"Origin": "null"},
                    {"Origin": "http://127.0.0.1:9999"}):
        assert desk.cross_site(_request(**headers)), headers
    dana = Visitor(operator(), "session:1.op.abc")
    other = Visitor(operator(), "session:2.op.def")
    assert desk.csrf_ok(dana, desk.csrf_token(dana))
    assert not desk.csrf_ok(dana, desk.csrf_token(other)) and not desk.csrf_ok(dana, "")


async def test_a_tenants_own_namespace_is_fenced_for_every_token(
        issuer: LocalIssuer, tmp_path: Path) -> None:
    """One namespace per tenant (INBOXCRM_TENANT_NAMESPACES): in globex's namespace an acme
    token is refused outright, globex's own opens its payloads, and even the static token
    opens only globex's (a payload of another tenant has no business there). The shared
    namespace keeps its per-payload rule."""
    keys_file = tmp_path / "codec-keys.json"
    ensure_key_file(keys_file)
    env = {"INBOXCRM_RELAY_HOST": "0.0.0.0", "INBOXCRM_CODEC_KEYS_FILE": str(keys_file),
           "INBOXCRM_CODEC_TOKEN": STATIC_TOKEN, "INBOXCRM_OIDC_ISSUER": issuer.url,
           "INBOXCRM_OIDC_AUDIENCE": AUDIENCE,
           "INBOXCRM_TENANT_NAMESPACES": "globex=inboxcrm-globex"}
    with mock.patch.dict("os.environ", env):
        settings = Settings()
    app = FastAPI()
    app.include_router(codec_router(settings))
    keys = EncryptionCodec(load_keyring(settings) or Keyring("x", {}))
    acme = await keys.for_tenant("acme").encode([Payload(data=b'{"acme": 1}')])
    globex = await keys.for_tenant("globex").encode([Payload(data=b'{"globex": 1}')])
    body = json_format.MessageToJson(Payloads(payloads=[*acme, *globex]))

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://relay.test") as codec:
        async def decode(token: str, namespace: str) -> httpx.Response:
            return await codec.post("/codec/decode", content=body, headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json",
                "X-Namespace": namespace})

        refused = await decode(issuer.token(tenants=["acme"]), "inboxcrm-globex")
        own = await decode(issuer.token(tenants=["globex"]), "inboxcrm-globex")
        static = await decode(STATIC_TOKEN, "inboxcrm-globex")
        shared = await decode(STATIC_TOKEN, "default")
        stray = await decode(STATIC_TOKEN, "inboxcrm-acme")  # no tenant's namespace

    assert refused.status_code == 403 and b"acme" not in refused.content
    assert stray.status_code == 403
    for answer in (own, static):
        assert answer.status_code == 200, answer.text
        theirs, mine = json_format.Parse(answer.text, Payloads()).payloads
        assert mine.data == b'{"globex": 1}'
        assert theirs == acme[0]
    both = [p.data for p in json_format.Parse(shared.text, Payloads()).payloads]
    assert both == [b'{"acme": 1}', b'{"globex": 1}']
