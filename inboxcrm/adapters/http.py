"""One request helper for every HTTP adapter: exceptions and non-2xx answers become
`AdapterError` through the shared classifier, so no adapter classifies on its own.

It also keeps the provider's request ID of the step's last answer (`last_request_id`): the
ID a provider's support asks for, recorded in the ledger row and the attempt's audit entry
(docs/architecture.md §4). It comes from outside, so only a bounded, plain value is kept."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Coroutine
from contextvars import ContextVar
from typing import Any

import httpx

from inboxcrm.adapters.base import AdapterError
from inboxcrm.adapters.errors import Classified, classify_exception, classify_response
from inboxcrm.platform import tracing

# The providers' request-ID headers, first found wins: HubSpot's correlation ID (the one its
# support asks for), then the common `X-Request-Id` (Pipedrive, Resend, the sandbox) and
# `Request-Id`. Header names are case-insensitive in httpx.
REQUEST_ID_HEADERS = ("x-hubspot-correlation-id", "x-request-id", "request-id")
MAX_REQUEST_ID = 128
# A UUID, a hex or base64 token, dotted or colon-separated parts: nothing that could carry
# markup, whitespace or control characters into a log, the audit or the review desk.
_SAFE_REQUEST_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:+/=-]{{0,{MAX_REQUEST_ID - 1}}}")
# The last answer's request ID in this step (each activity runs in a task of its own, so one
# step never sees another's). Reset before every request: a request without an answer (a
# timeout) leaves None, never an earlier request's ID.
_last_request_id: ContextVar[str | None] = ContextVar("inboxcrm_last_request_id", default=None)


def request_id_of(response: httpx.Response) -> str | None:
    """The provider's request ID of `response`, or None (none sent, or not a safe value:
    over MAX_REQUEST_ID characters or outside the plain charset)."""
    for name in REQUEST_ID_HEADERS:
        value = response.headers.get(name)
        if value is not None:
            value = value.strip()
            return value if _SAFE_REQUEST_ID.fullmatch(value) else None
    return None


def last_request_id() -> str | None:
    """The request ID of the last answer an adapter received in this step (None: none)."""
    return _last_request_id.get()


def clear_request_id() -> None:
    """Forget the last answer's ID (an attempt starts: nothing of an earlier one is kept)."""
    _last_request_id.set(None)


def send_request(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    json: Any = None,
    data: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    passthrough: Collection[int] = (),
    reason: Callable[[httpx.Response], str | None] | None = None,
) -> Coroutine[Any, Any, httpx.Response]:
    """Send one request (await it). 2xx and `passthrough` statuses are returned; anything else
    raises.

    `reason` lets an adapter name a provider-specific error (e.g. HubSpot's category) for
    the ledger's last_error without changing how the status is classified.
    With tracing on, the call is a CLIENT span: method, host, the path's shape, the status
    and the classified outcome (no query string, no body). With tracing off the caller awaits
    the request itself: not even a coroutine more (bench/tracing_overhead.py).
    """
    request = _send(client, method, url, json=json, data=data, params=params, headers=headers,
                    passthrough=passthrough, reason=reason)
    return _traced(client, method, url, request) if tracing.enabled() else request


async def _traced(client: httpx.AsyncClient, method: str, url: str,
                  request: Coroutine[Any, Any, httpx.Response]) -> httpx.Response:
    target = client.base_url.join(url)
    template = tracing.path_template(target.path)
    with tracing.destination_span(f"{method} {template}", {
            "http.request.method": method, "server.address": target.host,
            "server.port": target.port or (443 if target.scheme == "https" else 80),
            "url.template": template}) as span:
        try:
            response = await request
        except AdapterError as exc:
            _record_failure(span, exc)
            raise
        span.set_attribute("http.response.status_code", response.status_code)
        return response


def _record_failure(span: Any, exc: AdapterError) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", exc.classified.category.value)
    span.set_attribute("inboxcrm.failure.reason", exc.classified.reason)
    span.set_status(Status(StatusCode.ERROR, exc.classified.category.value))


async def _send(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    json: Any,
    data: dict[str, str] | None,
    params: dict[str, str] | None,
    headers: dict[str, str] | None,
    passthrough: Collection[int],
    reason: Callable[[httpx.Response], str | None] | None,
) -> httpx.Response:
    _last_request_id.set(None)
    try:
        response = await client.request(method, url, json=json, data=data, params=params,
                                        headers=headers)
    except httpx.HTTPError as exc:
        raise AdapterError(classify_exception(exc)) from None
    request_id = request_id_of(response)
    _last_request_id.set(request_id)
    if response.is_success or response.status_code in passthrough:
        return response
    label = reason(response) if reason else None
    classified: Classified = classify_response(response, label)
    raise AdapterError(classified, request_id)


def json_field(response: httpx.Response, key: str) -> str | None:
    """A top-level string field of a JSON error body, or None (never raises)."""
    try:
        body = response.json()
    except ValueError:
        return None
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, str) else None
