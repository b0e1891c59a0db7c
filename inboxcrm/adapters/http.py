"""One request helper for every HTTP adapter: exceptions and non-2xx answers become
`AdapterError` through the shared classifier, so no adapter classifies on its own."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import httpx

from inboxcrm.adapters.base import AdapterError
from inboxcrm.adapters.errors import Classified, classify_exception, classify_response


async def send_request(
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
) -> httpx.Response:
    """Send one request. 2xx and `passthrough` statuses are returned; anything else raises.

    `reason` lets an adapter name a provider-specific error (e.g. HubSpot's category) for
    the ledger's last_error without changing how the status is classified.
    """
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
