"""A Gmail API client for one mailbox (the calls the watcher needs, REST v1): `users.watch`,
`users.stop`, `users.history.list`, `users.messages.list` and `users.messages.get?format=raw`
(https://developers.google.com/workspace/gmail/api/reference/rest/v1/users).

The access token is handed in per call: the watcher reads it from the worker's
environment each time, never stores it. Failures are classified as every adapter's are: a
refused token (401/403) is permanent until the token is renewed, a 429 or 5xx or a dropped
connection transient; an expired `startHistoryId` is its own error (`HistoryExpired`), the
signal for the bounded full sync.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from inboxcrm.schemas.outcomes import Category, Classified

TIMEOUT = httpx.Timeout(30.0, connect=10.0)
PAGE_SIZE = 100


class GmailFailure(Exception):
    """A classified Gmail API failure; the message is a short code, never mail content."""

    def __init__(self, classified: Classified) -> None:
        super().__init__(classified.reason)
        self.classified = classified


class HistoryExpired(Exception):
    """`history.list` answered 404: the stored historyId is older than Gmail keeps."""


@dataclass(frozen=True)
class Watch:
    history_id: int
    expires_at: datetime


@dataclass
class HistoryPage:
    """Message IDs added in this page, each with the history record it came in, in order."""

    added: list[tuple[str, int]] = field(default_factory=list)
    history_id: int = 0
    next_page_token: str | None = None


class GmailClient:
    def __init__(self, api_url: str, address: str, token: str,
                 client: httpx.AsyncClient) -> None:
        self._base = f"{api_url.rstrip('/')}/gmail/v1/users/{quote(address, safe='@')}"
        self._headers = {"Authorization": f"Bearer {token}"}
        self._client = client

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._client.request(method, self._base + path,
                                                  headers=self._headers, timeout=TIMEOUT,
                                                  **kwargs)
        except httpx.HTTPError as exc:
            raise GmailFailure(Classified(Category.TRANSIENT,
                                          f"gmail_{type(exc).__name__.lower()}")) from None
        if response.status_code == 404 and path == "/history":
            raise HistoryExpired
        if response.status_code >= 400:
            raise GmailFailure(classify_status(response.status_code))
        return response.json() if response.content else {}

    async def watch(self, topic: str, label_ids: list[str]) -> Watch:
        body = await self._call("POST", "/watch", json={
            "topicName": topic, "labelIds": label_ids, "labelFilterBehavior": "INCLUDE"})
        expires = datetime.fromtimestamp(int(body["expiration"]) / 1000, UTC)
        return Watch(int(body["historyId"]), expires)

    async def stop(self) -> None:
        """`users.stop`: Gmail publishes no more pushes for this mailbox (an empty body
        both ways)."""
        await self._call("POST", "/stop")

    async def history(self, start_history_id: int, label_id: str,
                      page_token: str | None) -> HistoryPage:
        params: dict[str, Any] = {"startHistoryId": str(start_history_id),
                                  "historyTypes": "messageAdded", "labelId": label_id,
                                  "maxResults": PAGE_SIZE}
        if page_token:
            params["pageToken"] = page_token
        body = await self._call("GET", "/history", params=params)
        page = HistoryPage(history_id=int(body["historyId"]),
                           next_page_token=body.get("nextPageToken"))
        for record in body.get("history", []):
            for added in record.get("messagesAdded", []):
                page.added.append((str(added["message"]["id"]), int(record["id"])))
        return page

    async def list_ids(self, label_id: str, limit: int) -> list[str]:
        """The newest `limit` message IDs under the label (the bounded full sync)."""
        found: list[str] = []
        token: str | None = None
        while len(found) < limit:
            params: dict[str, Any] = {"labelIds": label_id,
                                      "maxResults": min(PAGE_SIZE, limit - len(found))}
            if token:
                params["pageToken"] = token
            body = await self._call("GET", "/messages", params=params)
            found += [str(m["id"]) for m in body.get("messages", [])]
            token = body.get("nextPageToken")
            if not token:
                break
        return found[:limit]

    async def raw(self, gmail_id: str) -> bytes | None:
        """The message as RFC 5322 bytes; None when it is gone (deleted meanwhile)."""
        try:
            body = await self._call("GET", f"/messages/{quote(gmail_id, safe='')}",
                                    params={"format": "raw"})
        except GmailFailure as exc:
            if exc.classified.status_code == 404:
                return None
            raise
        data = str(body["raw"])
        return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


def classify_status(status: int) -> Classified:
    if status in (401, 403):
        return Classified(Category.PERMANENT, f"gmail_http_{status}", status_code=status)
    if status == 429 or status >= 500:
        return Classified(Category.TRANSIENT, f"gmail_http_{status}", status_code=status)
    return Classified(Category.PERMANENT, f"gmail_http_{status}", status_code=status)
