"""The Gmail API subset through Google's own client (`google-api-python-client`, the
static discovery document it ships): `users.watch`, `users.stop`, `users.history.list`
with its pages and its 404 for an expired `startHistoryId`, `users.messages.list`,
`users.messages.get` in `raw` format, and a refused token; then the push the sandbox
sends, checked as the relay checks it (the OIDC token against the sandbox's JWKS). The
watcher (adapters/gmail.py) relies on exactly these shapes."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import httplib2
import httpx
import jwt
import pytest
from google.oauth2.credentials import Credentials
from googleapiclient.discovery import build
from googleapiclient.errors import HttpError

from inboxcrm.adapters.gmail import GmailClient, GmailFailure
from tests.helpers.sandbox_process import SandboxProcess, free_port

USER = "sales@acme.test"
TOKEN = "ya29.conformance-token"
TOPIC = "projects/inboxcrm-test/topics/gmail"
AUDIENCE = "https://relay.example/v1/inbound/gmail"
PUSHER = "gmail-push@inboxcrm-test.iam.gserviceaccount.com"


def message(n: int) -> str:
    return (f"From: Jane {n} <jane{n}@example.com>\r\nTo: {USER}\r\nSubject: Pricing {n}\r\n"
            f"Message-ID: <conformance-{n}@example.com>\r\n\r\nHow much for {n} seats?\r\n")


def gmail(sandbox: SandboxProcess, token: str = TOKEN) -> Any:
    return build("gmail", "v1", credentials=Credentials(token=token),
                 static_discovery=True, cache_discovery=False,
                 client_options={"api_endpoint": sandbox.url})


@pytest.fixture
def user(sandbox: SandboxProcess) -> str:
    httpx.post(f"{sandbox.url}/_sandbox/gmail/users",
               json={"email": USER, "token": TOKEN}).raise_for_status()
    return USER


def deliver(sandbox: SandboxProcess, n: int, push: bool = False,
            labels: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"email": USER, "raw": message(n), "push": push}
    if labels is not None:
        body["label_ids"] = labels
    answer = httpx.post(f"{sandbox.url}/_sandbox/gmail/deliver", json=body)
    answer.raise_for_status()
    return dict(answer.json())


def test_watch_history_and_raw_messages(sandbox: SandboxProcess, user: str) -> None:
    api = gmail(sandbox)
    watched = api.users().watch(userId="me", body={
        "topicName": TOPIC, "labelIds": ["INBOX"], "labelFilterBehavior": "INCLUDE"}).execute()
    assert set(watched) == {"historyId", "expiration"}
    start = int(watched["historyId"])
    assert int(watched["expiration"]) > 0
    delivered = [deliver(sandbox, n) for n in range(3)]
    deliver(sandbox, 99, labels=["SPAM"])  # not in the INBOX: not in its history

    page = api.users().history().list(userId=user, startHistoryId=str(start),
                                      historyTypes="messageAdded", labelId="INBOX",
                                      maxResults=2).execute()
    added = [a["message"]["id"] for h in page["history"] for a in h["messagesAdded"]]
    assert len(added) == 2 and "nextPageToken" in page
    assert all(int(h["id"]) > start for h in page["history"])
    rest = api.users().history().list(userId=user, startHistoryId=str(start),
                                      historyTypes="messageAdded", labelId="INBOX",
                                      pageToken=page["nextPageToken"]).execute()
    added += [a["message"]["id"] for h in rest["history"] for a in h["messagesAdded"]]
    assert "nextPageToken" not in rest
    assert added == [d["id"] for d in delivered]
    assert int(rest["historyId"]) >= max(int(d["historyId"]) for d in delivered)

    got = api.users().messages().get(userId="me", id=added[0], format="raw").execute()
    assert base64.urlsafe_b64decode(got["raw"]).decode() == message(0)
    assert got["id"] == added[0] and "INBOX" in got["labelIds"]

    listed = api.users().messages().list(userId="me", labelIds=["INBOX"],
                                         maxResults=2).execute()
    ids = [m["id"] for m in listed["messages"]]
    more = api.users().messages().list(userId="me", labelIds=["INBOX"],
                                       pageToken=listed["nextPageToken"]).execute()
    ids += [m["id"] for m in more["messages"]]
    assert ids == [d["id"] for d in reversed(delivered)]  # newest first, INBOX only

    # Up to date: no records, the current historyId.
    caught_up = api.users().history().list(userId="me", startHistoryId=rest["historyId"],
                                           historyTypes="messageAdded").execute()
    assert "history" not in caught_up and caught_up["historyId"] == rest["historyId"]


def test_an_expired_history_id_is_a_404(sandbox: SandboxProcess, user: str) -> None:
    api = gmail(sandbox)
    start = api.users().getProfile(userId="me").execute()["historyId"]
    deliver(sandbox, 1)
    httpx.post(f"{sandbox.url}/_sandbox/gmail/expire-history",
               json={"email": USER}).raise_for_status()
    with pytest.raises(HttpError) as refused:
        api.users().history().list(userId="me", startHistoryId=start).execute()
    assert refused.value.resp.status == 404
    assert json.loads(refused.value.content)["error"]["status"] == "NOT_FOUND"
    with pytest.raises(HttpError) as missing:
        api.users().messages().get(userId="me", id="0000000000000000", format="raw").execute()
    assert missing.value.resp.status == 404


def test_a_wrong_token_is_refused(sandbox: SandboxProcess, user: str) -> None:
    # Without credentials (they would try to refresh on a 401): the header set by hand.
    api = build("gmail", "v1", http=httplib2.Http(), static_discovery=True,
                cache_discovery=False, client_options={"api_endpoint": sandbox.url})
    request = api.users().history().list(userId="me", startHistoryId="1")
    request.headers["authorization"] = "Bearer ya29.someone-else"
    with pytest.raises(HttpError) as refused:
        request.execute()
    assert refused.value.resp.status == 401
    assert json.loads(refused.value.content)["error"]["status"] == "UNAUTHENTICATED"


class _Receiver(BaseHTTPRequestHandler):
    pushes: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("content-length") or 0)
        self.pushes.append((self.headers.get("authorization", ""), self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    _Receiver.pushes = []
    server = HTTPServer(("127.0.0.1", free_port()), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/push"
    server.shutdown()


def test_a_delivery_is_pushed_with_an_oidc_token(sandbox: SandboxProcess, user: str,
                                                      receiver: str) -> None:
    httpx.post(f"{sandbox.url}/_sandbox/gmail/push-subscriptions", json={
        "topic": TOPIC, "endpoint": receiver, "audience": AUDIENCE,
        "service_account": PUSHER}).raise_for_status()
    gmail(sandbox).users().watch(userId="me", body={"topicName": TOPIC,
                                                    "labelIds": ["INBOX"]}).execute()
    delivered = deliver(sandbox, 7, push=True)
    assert delivered["push_status"] == 204
    [(authorization, body)] = _Receiver.pushes
    envelope = json.loads(body)
    note = json.loads(base64.b64decode(envelope["message"]["data"]))
    assert note == {"emailAddress": USER, "historyId": int(delivered["historyId"])}
    assert envelope["message"]["messageId"] and envelope["message"]["publishTime"]
    assert envelope["subscription"].startswith("projects/inboxcrm-test/subscriptions/")
    keys = jwt.PyJWKSet.from_dict(httpx.get(f"{sandbox.url}/oauth2/v3/certs").json())
    token = authorization.removeprefix("Bearer ")
    key = {k.key_id: k.key for k in keys.keys}[jwt.get_unverified_header(token)["kid"]]
    claims = jwt.decode(token, key, algorithms=["RS256"], audience=AUDIENCE,
                        issuer=sandbox.url)
    assert claims["email"] == PUSHER and claims["email_verified"] is True



def test_stop_ends_the_watch_and_its_pushes(sandbox: SandboxProcess, user: str,
                                            receiver: str) -> None:
    """`users.stop` through Google's client answers the empty JSON object the reference
    documents (the discovery document gives it no response schema: the client hands back
    the bytes); the watch is gone and a delivery is no longer pushed."""
    httpx.post(f"{sandbox.url}/_sandbox/gmail/push-subscriptions", json={
        "topic": TOPIC, "endpoint": receiver, "audience": AUDIENCE,
        "service_account": PUSHER}).raise_for_status()
    api = gmail(sandbox)
    api.users().watch(userId="me", body={"topicName": TOPIC,
                                         "labelIds": ["INBOX"]}).execute()
    assert deliver(sandbox, 1, push=True)["push_status"] == 204
    assert api.users().stop(userId=user).execute() == b"{}"
    assert deliver(sandbox, 2, push=True)["push_status"] is None
    assert len(_Receiver.pushes) == 1
    state = httpx.get(f"{sandbox.url}/_sandbox/gmail/state", params={"email": USER}).json()
    assert state["watch"] is None
    assert [s["had_watch"] for s in state["stops"]] == [True]


async def test_inboxcrms_client_stops_the_same_way(sandbox: SandboxProcess, user: str) -> None:
    """The watcher's `stop_gmail_watch` call (adapters/gmail.py) against the same endpoint:
    taken with or without a watch (an empty body, as older versions of the reference
    describe, is taken too); a refused token is its classified 401."""
    async with httpx.AsyncClient() as http:
        await GmailClient(sandbox.url, user, TOKEN, http).watch(TOPIC, ["INBOX"])
        await GmailClient(sandbox.url, user, TOKEN, http).stop()
        await GmailClient(sandbox.url, user, TOKEN, http).stop()
        with pytest.raises(GmailFailure) as refused:
            await GmailClient(sandbox.url, user, "ya29.someone-else", http).stop()
        state = (await http.get(f"{sandbox.url}/_sandbox/gmail/state",
                                params={"email": user})).json()
    assert refused.value.classified.status_code == 401
    assert state["watch"] is None
    assert [s["had_watch"] for s in state["stops"]] == [True, False]
