"""The review desk's sessions end (issue 36, docs/architecture.md §6 "Sessions"), over the
stack's relay and a second relay of the test's own on the same PostgreSQL and Temporal:

- signing out ends the session: the cookie replayed afterwards is refused;
- a session without a request for longer than the idle time is refused;
- an operator session does not survive a rotation of the operator token: a relay started
  with a new `INBOXCRM_REVIEW_TOKEN` refuses it (and signs the new token in);
- the store keeps only the SHA-256 of a session's ID, and who signed in (`op`, `r<id>`).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from urllib.parse import urlencode

import httpx
import pytest

from inboxcrm.stack.processes import ManagedProcess, free_port, http_answers, python
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


async def sign_in(http: httpx.AsyncClient, relay: str, token: str) -> str:
    login = await http.post(f"{relay}/review/login",
                            content=urlencode({"token": token, "next": "/review/"}),
                            headers=FORM)
    assert login.status_code == 303, login.text
    return str(login.headers["set-cookie"].split(";", 1)[0])


async def queue(http: httpx.AsyncClient, relay: str, cookie: str) -> int:
    return (await http.get(f"{relay}/review/", headers={"Cookie": cookie})).status_code


@pytest.fixture
def rotated_relay(stack: Stack) -> Iterator[tuple[str, str]]:
    """The relay as it runs after the operator rotated INBOXCRM_REVIEW_TOKEN: the same
    decision secret, store and Temporal, a new operator token. (URL, new token)."""
    token = secrets.token_urlsafe(32)
    port = free_port()
    env = dict(stack.env, INBOXCRM_REVIEW_TOKEN=token, INBOXCRM_RELAY_PORT=str(port),
               INBOXCRM_RELAY_METRICS_ADDRESS=f"127.0.0.1:{free_port()}",
               INBOXCRM_PUBLIC_RELAY_URL=f"http://127.0.0.1:{port}")
    relay = ManagedProcess(f"relay-rotated-{port}", python("inboxcrm.ingress.main"), env,
                           stack.log_dir).start()
    url = f"http://127.0.0.1:{port}"
    try:
        relay.wait_ready(http_answers(f"{url}/healthz"), timeout=120)
        yield url, token
    finally:
        relay.kill()


async def test_sign_out_ends_the_session_and_a_replayed_cookie_is_refused(
        env: StackClient, stack: Stack) -> None:
    relay = stack.relay_url
    cookie = await sign_in(env.http, relay, stack.env["INBOXCRM_REVIEW_TOKEN"])
    assert await queue(env.http, relay, cookie) == 200
    value = cookie.split("=", 1)[1]
    row = await env.db.fetchrow("SELECT who, credential FROM review_sessions "
                                "WHERE session_sha256 = $1",
                                hashlib.sha256(value.encode()).digest())
    assert row is not None and row["who"] == "op"
    assert value not in row["credential"]  # the cookie itself is nowhere in the store

    out = await env.http.post(f"{relay}/review/logout", headers={"Cookie": cookie})
    assert out.status_code == 303
    assert await queue(env.http, relay, cookie) == 401  # the copy someone kept, replayed
    again = await sign_in(env.http, relay, stack.env["INBOXCRM_REVIEW_TOKEN"])
    assert again != cookie and await queue(env.http, relay, again) == 200


async def test_an_idle_session_ends(env: StackClient, stack: Stack) -> None:
    relay = stack.relay_url
    cookie = await sign_in(env.http, relay, stack.env["INBOXCRM_REVIEW_TOKEN"])
    digest = hashlib.sha256(cookie.split("=", 1)[1].encode()).digest()
    # Half an hour and a minute pass without a request (the default idle time is 30 min).
    await env.db.execute("UPDATE review_sessions SET last_seen_at = now() - interval "
                         "'31 minutes' WHERE session_sha256 = $1", digest)
    assert await queue(env.http, relay, cookie) == 401
    busy = await sign_in(env.http, relay, stack.env["INBOXCRM_REVIEW_TOKEN"])
    await env.db.execute("UPDATE review_sessions SET last_seen_at = now() - interval "
                         "'29 minutes' WHERE session_sha256 = $1",
                         hashlib.sha256(busy.split("=", 1)[1].encode()).digest())
    assert await queue(env.http, relay, busy) == 200  # within it, and seen again now
    assert await queue(env.http, relay, busy) == 200


async def test_an_operator_session_does_not_survive_a_rotated_operator_token(
        env: StackClient, stack: Stack, rotated_relay: tuple[str, str]) -> None:
    before = await sign_in(env.http, stack.relay_url, stack.env["INBOXCRM_REVIEW_TOKEN"])
    assert await queue(env.http, stack.relay_url, before) == 200
    rotated, new_token = rotated_relay
    assert await queue(env.http, rotated, before) == 401
    after = await sign_in(env.http, rotated, new_token)
    assert await queue(env.http, rotated, after) == 200
    # ... and the old token no longer signs in there at all.
    refused = await env.http.post(f"{rotated}/review/login", headers=FORM, content=urlencode(
        {"token": stack.env["INBOXCRM_REVIEW_TOKEN"], "next": "/review/"}))
    assert refused.status_code == 401
