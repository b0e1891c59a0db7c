"""Microsoft Graph v1.0, the calls the mailbox watcher makes (docs/mailboxes.md):

- `POST /subscriptions`, `PATCH /subscriptions/{id}`, `DELETE /subscriptions/{id}`
  (learn.microsoft.com/graph/api/subscription-post-subscriptions, …-update, …-delete);
- `GET /users/{id}/mailFolders/{folder}/messages/delta`, paged by `@odata.nextLink` and
  ended by `@odata.deltaLink` (learn.microsoft.com/graph/api/message-delta);
- `GET /users/{id}/messages/{id}/$value`, the MIME of one message
  (learn.microsoft.com/graph/outlook-get-mime-message).

Every request asks `Prefer: IdType="ImmutableId"` (learn.microsoft.com/graph/outlook-immutable-id):
a message's ID then survives moves between folders, so it can be the item's delivery ID.
Reads are safe to repeat; subscription calls are repaired by the watcher (a lost create is
found again as no notification and replaced, a renewal is idempotent).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from inboxcrm.adapters.errors import classify_exception, classify_response
from inboxcrm.schemas.outcomes import Category, Classified

IMMUTABLE_IDS = 'IdType="ImmutableId"'
DELTA_PAGE_SIZE = 50
TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# Graph's message IDs are URL-safe base64 (with `=` padding; `-` and `_` for `+` and `/`).
# Anything else in a notification or a delta answer is refused, never put into a URL or ID.
MESSAGE_ID = re.compile(r"^[A-Za-z0-9_=+-]{1,512}$")


class GraphFailure(Exception):
    """A classified failure of a Graph call (no payload in it)."""

    def __init__(self, classified: Classified) -> None:
        super().__init__(classified.reason)
        self.classified = classified


@dataclass(frozen=True)
class DeltaPage:
    """One page of the delta query: the IDs of messages added or changed (not `@removed`),
    and the link to the next page, or the delta link that ends the round."""

    ids: list[str]
    next_link: str | None
    delta_link: str | None


def graph_time(moment: datetime) -> str:
    """ISO 8601 in UTC, as Graph writes `expirationDateTime`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_graph_time(value: str) -> datetime:
    """Graph's `2026-12-06T07:00:00.1234567Z` (seven fraction digits) as a datetime."""
    text = value.strip().replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        digits = re.match(r"\d*", rest)
        frac = digits.group(0) if digits else ""
        text = f"{head}.{frac[:6].ljust(6, '0')}{rest[len(frac):]}"
    return datetime.fromisoformat(text)


class GraphClient:
    """Graph calls with one mailbox's access token (read from the workers' environment)."""

    def __init__(self, base_url: str, token: str, *,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            timeout=TIMEOUT, transport=transport,
            headers={"Authorization": f"Bearer {token}", "Prefer": IMMUTABLE_IDS})

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, url: str, *, json: Any = None,
                    headers: dict[str, str] | None = None, ok: tuple[int, ...] = (200,)
                    ) -> httpx.Response:
        try:
            response = await self._http.request(method, url, json=json, headers=headers)
        except httpx.HTTPError as exc:
            raise GraphFailure(classify_exception(exc, sent=method == "GET")) from None
        if response.status_code not in ok:
            raise GraphFailure(classify_response(response, _reason(response)))
        return response

    def _url(self, path: str) -> str:
        return f"{self.base_url}/v1.0/{path}"

    async def create_subscription(self, *, user: str, folder: str, notification_url: str,
                                  client_state: str, expires: datetime) -> dict[str, Any]:
        """A subscription on the folder's messages, `created` only, lifecycle notifications
        to the same URL (Graph validates both with its `validationToken` handshake)."""
        body = {"changeType": "created",
                "notificationUrl": notification_url,
                "lifecycleNotificationUrl": notification_url,
                "resource": f"users/{user}/mailFolders('{folder}')/messages",
                "expirationDateTime": graph_time(expires),
                "clientState": client_state}
        response = await self._call("POST", self._url("subscriptions"), json=body, ok=(201,))
        return _object(response)

    async def renew_subscription(self, subscription_id: str, expires: datetime
                                 ) -> dict[str, Any]:
        response = await self._call(
            "PATCH", self._url(f"subscriptions/{quote(subscription_id, safe='')}"),
            json={"expirationDateTime": graph_time(expires)})
        return _object(response)

    async def delete_subscription(self, subscription_id: str) -> None:
        await self._call("DELETE", self._url(f"subscriptions/{quote(subscription_id, safe='')}"),
                         ok=(204, 404))

    async def delta_page(self, *, user: str, folder: str, link: str | None) -> DeltaPage:
        """The page at `link` (a stored delta or next link), or the first page of a new
        round without one. Only links on this client's host are followed."""
        if link is None:
            url = self._url(f"users/{quote(user, safe='@')}/mailFolders/{folder}/messages/delta"
                            "?$select=id")
        else:
            if urlsplit(link).netloc != urlsplit(self.base_url).netloc:
                raise GraphFailure(Classified(Category.PERMANENT, "graph_foreign_link"))
            url = link
        response = await self._call(
            "GET", url, headers={"Prefer": f"{IMMUTABLE_IDS}, odata.maxpagesize="
                                           f"{DELTA_PAGE_SIZE}"})
        page = _object(response)
        ids: list[str] = []
        for entry in page.get("value") or []:
            if not isinstance(entry, dict) or "@removed" in entry:
                continue
            message_id = entry.get("id")
            if isinstance(message_id, str) and MESSAGE_ID.match(message_id):
                ids.append(message_id)
        next_link = page.get("@odata.nextLink")
        delta_link = page.get("@odata.deltaLink")
        if not isinstance(next_link, str) and not isinstance(delta_link, str):
            raise GraphFailure(Classified(Category.TRANSIENT, "graph_delta_without_link"))
        return DeltaPage(ids, next_link if isinstance(next_link, str) else None,
                         delta_link if isinstance(delta_link, str) else None)

    async def mime(self, *, user: str, message_id: str, max_bytes: int) -> bytes | None:
        """The message's MIME, or None when it is over `max_bytes` (not read further), or
        when it is gone (deleted before it was read)."""
        url = self._url(f"users/{quote(user, safe='@')}/messages/"
                        f"{quote(message_id, safe='')}/$value")
        try:
            async with self._http.stream("GET", url) as response:
                if response.status_code == 404:
                    return None
                if response.status_code != 200:
                    await response.aread()
                    raise GraphFailure(classify_response(response, _reason(response)))
                parts: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise _TooLarge
                    parts.append(chunk)
                return b"".join(parts)
        except _TooLarge:
            return None
        except httpx.HTTPError as exc:
            raise GraphFailure(classify_exception(exc, sent=True)) from None


class _TooLarge(Exception):
    pass


def _object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise GraphFailure(Classified(Category.TRANSIENT, "graph_malformed_answer",
                                      status_code=response.status_code))
    return body


def _reason(response: httpx.Response) -> str:
    """`graph_{status}` with Graph's error code when it is a plain word (no payload)."""
    code = ""
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            code = error["code"]
    except (ValueError, AttributeError):
        pass
    if code and re.fullmatch(r"[A-Za-z0-9_.]{1,60}", code):
        return f"graph_{response.status_code}_{code.lower()}"
    return f"graph_{response.status_code}"
