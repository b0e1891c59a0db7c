"""The codec server of the Temporal UI and CLI (`POST /codec/encode`, `/codec/decode`): decodes
history for authorised people with the payload codec of `inboxcrm.platform.codec`
(docs/architecture.md §7).

A credential is required unless the local stack's relay (`INBOXCRM_ENV=local`) listens on
loopback with none configured, and then only for requests addressed to a loopback name (a
page of another site that rebinds its DNS name to 127.0.0.1 sends its own name as `Host`, and
is refused). Otherwise the credential is the static
bearer token `INBOXCRM_CODEC_TOKEN` (the local stack, scripts), or the signed-in person's access
token that a Temporal UI with single sign-on passes (`codec.passAccessToken`): a JWT of
`INBOXCRM_OIDC_ISSUER` for `INBOXCRM_OIDC_AUDIENCE`, verified against the issuer's published
keys, naming at least one tenant in `INBOXCRM_OIDC_TENANTS_CLAIM`. Such a token opens only the
payloads of the tenants it names: each payload of a tenant's workflow is sealed with that
tenant's key and labelled with it (`inboxcrm.platform.codec`), and the others are returned
still sealed (the UI shows them as encoded). The static token and the open local codec open
every payload of the namespace asked for (`X-Namespace`). Temporal's own authorisation still
decides which workflows a person can list (one namespace per tenant,
INBOXCRM_TENANT_NAMESPACES: docs/architecture.md §7): in a tenant's own namespace the codec
opens that tenant's payloads only, and refuses a token that names only other tenants."""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging

from fastapi import APIRouter, Request, Response
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from inboxcrm.domain.policy import current_policies
from inboxcrm.ingress.web import read_body
from inboxcrm.platform import oidc
from inboxcrm.platform.codec import CodecError, payload_codec
from inboxcrm.platform.config import Settings
from inboxcrm.platform.temporal import TenantNamespaces, effective_namespace, tenant_namespaces

log = logging.getLogger("inboxcrm.ingress.codec")

CORS_ALLOW_HEADERS = "content-type,x-namespace,authorization"
LOOPBACK_NAMES = {"localhost"}


def _csv(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a `Host` header without its port (`[::1]:8080` -> `::1`)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if ":" in header else header


def codec_router(settings: Settings) -> APIRouter:
    """`POST /codec/encode` and `POST /codec/decode` (+ CORS preflight) for the relay."""
    codec = payload_codec(settings)
    origins = set(_csv(settings.codec_cors_origins))
    default_namespace = effective_namespace(settings)  # the setting, or the Temporal profile's
    # One namespace per tenant (docs/architecture.md §7, Namespaces): every tenant's own
    # namespace is served too, and a namespace of one tenant opens that tenant's payloads
    # only, whoever asks.
    mapping = tenant_namespaces(settings)
    tenants_in = namespace_tenants(mapping, sorted(current_policies())
                                   if mapping.per_tenant else [])
    namespaces = (set(_csv(settings.codec_namespaces))
                  or {default_namespace, *tenants_in})
    token = settings.codec_token.get_secret_value() if settings.codec_token else ""
    verifier = oidc.verifier_from(settings.oidc_issuer, settings.oidc_audience,
                                  settings.oidc_tenants_claim, settings.oidc_jwks_cache_seconds)
    open_access = (not token and verifier is None and settings.env == "local"
                   and is_loopback(settings.relay_host))
    if not token and verifier is None and not open_access:
        log.warning("codec endpoint refuses every request: set INBOXCRM_CODEC_TOKEN or "
                    "INBOXCRM_OIDC_ISSUER/_AUDIENCE (required outside the local stack's "
                    "loopback relay)")
    router = APIRouter()

    def cors(request: Request, response: Response) -> Response:
        origin = request.headers.get("origin")
        if origin and (origin in origins or "*" in origins):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Methods"] = "POST, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = CORS_ALLOW_HEADERS
            response.headers["Access-Control-Allow-Credentials"] = "true"
            response.headers["Access-Control-Max-Age"] = "600"
        response.headers["Vary"] = "Origin"
        return response

    async def refusal(request: Request) -> Response | frozenset[str] | None:
        """The 401/403 to answer; else the tenants whose payloads the caller may open (None:
        every payload)."""
        if open_access:
            if is_loopback(host_name(request.headers.get("host", ""))):
                return None
            return _json_error(403, "the open local codec answers only requests to a loopback "
                                    "address (Host)")
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            return Response(status_code=401, headers={"WWW-Authenticate": "Bearer"})
        if token and hmac.compare_digest(presented.encode(), token.encode()):
            return None
        if verifier is not None and oidc.looks_like_jwt(presented):
            try:
                principal = await verifier.principal(presented)
            except oidc.TokenRefused as exc:
                log.info("codec: access token refused (%s)", exc)
                return Response(status_code=401, headers={
                    "WWW-Authenticate": 'Bearer error="invalid_token"'})
            if not principal.tenants:
                return _json_error(403, "the access token names no tenant this person reviews")
            return principal.tenants
        return Response(status_code=401, headers={"WWW-Authenticate": "Bearer"})

    async def apply(request: Request, encode: bool) -> Response:
        refused = await refusal(request)
        if isinstance(refused, Response):
            return cors(request, refused)
        namespace = request.headers.get("x-namespace") or default_namespace
        if namespace not in namespaces:
            return cors(request, _json_error(403, "namespace not served by this codec"))
        own = tenants_in.get(namespace)
        if own is not None:
            # A tenant's own namespace: only its payloads, and only for a caller who may
            # open them (a token of another tenant is refused, not answered still sealed).
            if refused is not None and not refused & own:
                return cors(request, _json_error(
                    403, "this namespace belongs to a tenant the access token does not name"))
            refused = own if refused is None else refused & own
        body = await read_body(request, settings.max_body_bytes)
        if body is None:
            return cors(request, _json_error(413, "body too large"))
        try:
            payloads = json_format.Parse(body, Payloads())
        except (json_format.ParseError, ValueError):
            return cors(request, _json_error(
                400, 'body must be {"payloads": [{"metadata": {...}, "data": "<base64>"}]}'))
        try:
            if codec is None:
                result = list(payloads.payloads)
            elif encode:
                # What a person sends from the UI (a signal's input) is sealed for their
                # tenant when their token names one, so they can read it back.
                only = next(iter(refused)) if refused is not None and len(refused) == 1 else None
                result = await codec.for_tenant(only).encode(payloads.payloads)
            else:
                result = codec.decrypt_for(payloads.payloads, refused)
        except CodecError as exc:
            return cors(request, _json_error(400, str(exc)))
        return cors(request, Response(json_format.MessageToJson(Payloads(payloads=result)),
                                      media_type="application/json"))

    async def preflight(request: Request) -> Response:
        return cors(request, Response(status_code=204))

    async def encode_route(request: Request) -> Response:
        return await apply(request, encode=True)

    async def decode_route(request: Request) -> Response:
        return await apply(request, encode=False)

    router.add_api_route("/codec/encode", encode_route, methods=["POST"],
                         include_in_schema=False)
    router.add_api_route("/codec/decode", decode_route, methods=["POST"],
                         include_in_schema=False)
    for path in ("/codec/encode", "/codec/decode"):
        router.add_api_route(path, preflight, methods=["OPTIONS"], include_in_schema=False)
    return router


def namespace_tenants(mapping: TenantNamespaces, tenants: list[str]) -> dict[str, frozenset[str]]:
    """Each tenant's own namespace (not the shared one) with the tenant in it."""
    out: dict[str, set[str]] = {}
    for tenant in tenants:
        namespace = mapping.of(tenant)
        if namespace != mapping.shared:
            out.setdefault(namespace, set()).add(tenant)
    return {namespace: frozenset(names) for namespace, names in out.items()}


def _json_error(status_code: int, message: str) -> Response:
    return Response(json.dumps({"status": "error", "message": message}),
                    status_code=status_code, media_type="application/json")

