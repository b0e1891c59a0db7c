"""The sandbox's Microsoft Graph mail subset answers what Graph v1.0 documents (no official
SDK here: `msgraph-sdk` brings kiota's whole stack for five calls; the documented JSON
shapes are checked instead, each against its page on learn.microsoft.com):

- graph/api/subscription-post-subscriptions: 201 with the subscription; Graph first POSTs
  `?validationToken=` to the notification URL (and the lifecycle URL) and refuses the
  subscription unless the token comes back as text/plain with 200 within 10 s
  (graph/change-notifications-delivery-webhooks, "Notification endpoint validation");
  Outlook messages at most 10,080 minutes; clientState at most 128 characters;
- graph/api/subscription-update (PATCH `expirationDateTime` → 200), subscription-delete (204);
- graph/api/resources/changenotification(collection): `{"value": [{"subscriptionId",
  "subscriptionExpirationDateTime", "changeType", "resource", "resourceData", "clientState",
  "tenantId"}]}`; graph/change-notifications-lifecycle-events: `lifecycleEvent` instead of
  `changeType`;
- graph/api/message-delta: `@odata.nextLink` pages, `@odata.deltaLink` last, honouring
  `Prefer: odata.maxpagesize`; graph/outlook-get-mime-message (`$value`, MIME as text/plain);
  graph/outlook-immutable-id (`Prefer: IdType="ImmutableId"`, `Preference-Applied`);
- graph/errors: `{"error": {"code", "message", "innerError"}}`.

The product's own client (inboxcrm/adapters/graph.py) makes the calls where it can, so the
adapter and the fake are held to the same shapes.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from inboxcrm.adapters.graph import GraphClient, GraphFailure, parse_graph_time
from tests.helpers.sandbox_process import API_KEY, SandboxProcess, free_port

IMMUTABLE = {"Prefer": 'IdType="ImmutableId"'}


class Receiver:
    """A notification endpoint: answers the validation handshake (or refuses it, `echo`
    False) and records every notification batch."""

    def __init__(self) -> None:
        self.echo = True
        self.validations: list[tuple[str, str]] = []
        self.batches: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                query = parse_qs(urlsplit(self.path).query)
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                if "validationToken" in query:
                    token = query["validationToken"][0]
                    receiver.validations.append((token, self.headers.get("content-type", "")))
                    answer = (token if receiver.echo else "no").encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                    return
                receiver.batches.append(json.loads(body))
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notify"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.server.shutdown()


def user() -> str:
    return f"u{uuid.uuid4().hex[:10]}@contoso.test"


def graph(sandbox: SandboxProcess) -> GraphClient:
    return GraphClient(sandbox.url, API_KEY)


def soon(minutes: int = 60) -> datetime:
    return datetime.now(UTC) + timedelta(minutes=minutes)


async def deliver(sandbox: SandboxProcess, mailbox: str, notify: int = 1) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=sandbox.url) as control:
        answer = await control.post("/_sandbox/graph/deliver", json={
            "mailbox": mailbox, "notify": notify,
            "mime": f"Message-ID: <{uuid.uuid4()}@contoso.test>\r\nSubject: hi\r\n\r\nbody\r\n"})
        answer.raise_for_status()
        return dict(answer.json())


def assert_graph_error(answer: httpx.Response, status: int, code: str) -> None:
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["code"] == code and isinstance(error["message"], str)
    assert set(error["innerError"]) >= {"date", "request-id"}


async def test_subscription_is_created_after_the_validation_handshake(
        sandbox: SandboxProcess, receiver: Receiver) -> None:
    client = graph(sandbox)
    mailbox = user()
    created = await client.create_subscription(
        user=mailbox, folder="inbox", notification_url=receiver.url, client_state="s" * 128,
        expires=soon())
    await client.aclose()
    # Both URLs validated (notification and lifecycle), each answered as text/plain.
    assert len(receiver.validations) == 2
    assert all(token.startswith("Validation:") for token, _ in receiver.validations)
    assert created["@odata.context"].endswith("$metadata#subscriptions/$entity")
    assert set(created) >= {"id", "resource", "applicationId", "changeType", "clientState",
                            "notificationUrl", "lifecycleNotificationUrl",
                            "expirationDateTime", "creatorId", "includeResourceData",
                            "latestSupportedTlsVersion"}
    assert created["changeType"] == "created"
    assert created["resource"] == f"users/{mailbox}/mailFolders('inbox')/messages"
    assert uuid.UUID(created["id"])
    assert abs((parse_graph_time(created["expirationDateTime"]) - soon()).total_seconds()) < 60


async def test_subscription_is_refused_when_the_endpoint_does_not_echo(
        sandbox: SandboxProcess, receiver: Receiver) -> None:
    receiver.echo = False
    body = {"changeType": "created", "notificationUrl": receiver.url,
            "resource": f"users/{user()}/mailFolders('inbox')/messages",
            "expirationDateTime": soon().isoformat(), "clientState": "x"}
    auth = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=sandbox.url, headers=auth) as http:
        refused = await http.post("/v1.0/subscriptions", json=body)
        assert_graph_error(refused, 400, "InvalidRequest")
        receiver.echo = True
        too_long = await http.post("/v1.0/subscriptions", json={
            **body, "expirationDateTime": soon(10_081).isoformat()})
        assert_graph_error(too_long, 400, "InvalidRequest")
        state = await http.post("/v1.0/subscriptions", json={**body, "clientState": "c" * 129})
        assert_graph_error(state, 400, "InvalidRequest")
    async with httpx.AsyncClient(base_url=sandbox.url) as anonymous:
        assert_graph_error(await anonymous.post("/v1.0/subscriptions", json=body), 401,
                           "InvalidAuthenticationToken")


async def test_change_notifications_carry_the_documented_fields(
        sandbox: SandboxProcess, receiver: Receiver) -> None:
    client = graph(sandbox)
    mailbox = user()
    sub = await client.create_subscription(
        user=mailbox, folder="inbox", notification_url=receiver.url, client_state="secret",
        expires=soon())
    message = await deliver(sandbox, mailbox, notify=2)
    assert message["notifications"] == [202, 202]
    assert len(receiver.batches) == 2 and receiver.batches[0] == receiver.batches[1]
    [note] = receiver.batches[0]["value"]
    assert set(note) == {"subscriptionId", "subscriptionExpirationDateTime", "changeType",
                         "resource", "resourceData", "clientState", "tenantId"}
    assert note["subscriptionId"] == sub["id"] and note["clientState"] == "secret"
    assert note["changeType"] == "created"
    # Created with Prefer: IdType="ImmutableId": the notification names the immutable ID.
    assert note["resourceData"]["id"] == message["id"] != message["rest_id"]
    assert note["resourceData"]["@odata.type"] == "#Microsoft.Graph.Message"
    assert note["resource"] == note["resourceData"]["@odata.id"] == \
        f"Users/{mailbox}/Messages/{message['id']}"
    mime = await client.mime(user=mailbox, message_id=message["id"], max_bytes=10_000)
    assert mime is not None and mime.startswith(b"Message-ID: <")
    # The REST ID reads the same message; a message too large for the cap is not read.
    assert await client.mime(user=mailbox, message_id=message["rest_id"],
                             max_bytes=10_000) == mime
    assert await client.mime(user=mailbox, message_id=message["id"], max_bytes=10) is None
    await client.aclose()


async def test_lifecycle_notifications(sandbox: SandboxProcess, receiver: Receiver) -> None:
    client = graph(sandbox)
    mailbox = user()
    sub = await client.create_subscription(
        user=mailbox, folder="inbox", notification_url=receiver.url, client_state="life",
        expires=soon())
    async with httpx.AsyncClient(base_url=sandbox.url) as control:
        for event in ("missed", "reauthorizationRequired", "subscriptionRemoved"):
            answer = await control.post("/_sandbox/graph/lifecycle",
                                        json={"mailbox": mailbox, "event": event})
            assert answer.json()["notifications"] == [202]
    events = [batch["value"][0] for batch in receiver.batches]
    assert [e["lifecycleEvent"] for e in events] == ["missed", "reauthorizationRequired",
                                                     "subscriptionRemoved"]
    assert all("changeType" not in e and e["subscriptionId"] == sub["id"]
               and e["clientState"] == "life" for e in events)
    # Removed: renewing it is a 404 (the watcher then creates a new one).
    with pytest.raises(GraphFailure) as refused:
        await client.renew_subscription(sub["id"], soon(120))
    assert refused.value.classified.status_code == 404
    await client.aclose()


async def test_renew_and_delete(sandbox: SandboxProcess, receiver: Receiver) -> None:
    client = graph(sandbox)
    sub = await client.create_subscription(
        user=user(), folder="inbox", notification_url=receiver.url, client_state="r",
        expires=soon())
    renewed = await client.renew_subscription(sub["id"], soon(2 * 24 * 60))
    assert renewed["id"] == sub["id"]
    assert abs((parse_graph_time(renewed["expirationDateTime"]) - soon(2 * 24 * 60))
               .total_seconds()) < 60
    await client.delete_subscription(sub["id"])
    async with httpx.AsyncClient(base_url=sandbox.url,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        assert (await http.delete(f"/v1.0/subscriptions/{sub['id']}")).status_code == 404
    await client.aclose()


async def test_delta_pages_then_ends_with_a_delta_link(sandbox: SandboxProcess) -> None:
    mailbox = user()
    sent = [await deliver(sandbox, mailbox, notify=0) for _ in range(5)]
    auth = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=sandbox.url, headers=auth) as http:
        first = await http.get(f"/v1.0/users/{mailbox}/mailFolders/inbox/messages/delta",
                               headers={"Prefer": 'IdType="ImmutableId", odata.maxpagesize=2'})
        assert first.status_code == 200
        assert first.headers["preference-applied"] == 'IdType="ImmutableId"'
        page = first.json()
        assert page["@odata.context"].endswith("$metadata#Collection(message)")
        assert "@odata.nextLink" in page and "@odata.deltaLink" not in page
        assert [m["id"] for m in page["value"]] == [m["id"] for m in sent[:2]]
        assert all(m["@odata.type"] == "#microsoft.graph.message" for m in page["value"])
        # Without the preference, the REST IDs.
        plain = (await http.get(f"/v1.0/users/{mailbox}/mailFolders/inbox/messages/delta"))
        assert [m["id"] for m in plain.json()["value"]] == [m["rest_id"] for m in sent]
    client = graph(sandbox)
    ids: list[str] = []
    link: str | None = None
    while True:
        got = await client.delta_page(user=mailbox, folder="inbox", link=link)
        ids += got.ids
        link = got.next_link or got.delta_link
        if got.next_link is None:
            break
    assert ids == [m["id"] for m in sent]
    # The delta link names only what came after it.
    later = await deliver(sandbox, mailbox, notify=0)
    round2 = await client.delta_page(user=mailbox, folder="inbox", link=link)
    assert round2.ids == [later["id"]] and round2.delta_link is not None
    await client.aclose()
