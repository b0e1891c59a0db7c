"""One request helper for every HTTP adapter: exceptions and non-2xx answers become
`AdapterError` through the shared classifier, so no adapter classifies on its own."""

from __future__ import annotations

from collections.abc import Callable, Collection, Coroutine
from typing import Any

import httpx

from inboxcrm.adapters.base import AdapterError
from inboxcrm.adapters.errors import Classified, classify_exception, classify_response
from inboxcrm.platform import tracing


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
    try:
        response = await client.request(method, url, json=json, data=data, params=params,
                                        headers=headers)
    except httpx.HTTPError as exc:
        raise AdapterError(classify_exception(exc)) from None
    if response.is_success or response.status_code in passthrough:
        return response
    label = reason(response) if reason else None
    classified: Classified = classify_response(response, label)
    raise AdapterError(classified)


def json_field(response: httpx.Response, key: str) -> str | None:
    """A top-level string field of a JSON error body, or None (never raises)."""
    try:
        body = response.json()
    except ValueError:
        return None
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, str) else None
