"""The relay's side of the Internet boundary, against the running test relay: hostile forms
are refused fast while the relay keeps answering, an oversized login body is refused before
it was sent, credentials write only into their tenants (counted in `inbound_events`), and
metrics are not on the public port."""

from __future__ import annotations

import asyncio
import time
import uuid
from urllib.parse import urlsplit

import httpx

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email

TWENTY_MB = 20 * 1024 * 1024


async def stored(env: StackClient, delivery_id: str) -> int:
    return await env.count("SELECT count(*) FROM inbound_events WHERE delivery_id = $1",
                           delivery_id)


def nested_form(depth: int) -> tuple[str, bytes]:
    """An unsigned Mailgun form whose `body-mime` part is multipart nested `depth` deep."""
    nested = b"".join(f"--n{i}\r\nContent-Type: multipart/mixed; boundary=n{i + 1}\r\n\r\n"
                      .encode() for i in range(depth))
    body = (b"--outer\r\nContent-Disposition: form-data; name=\"body-mime\"\r\n"
            b"Content-Type: multipart/mixed; boundary=n0\r\n\r\n" + nested
            + b"\r\n--outer--\r\n")
    return "multipart/form-data; boundary=outer", body


async def test_a_deeply_nested_unsigned_mailgun_form_is_refused_while_healthz_answers(
    env: StackClient, stack: Stack,
) -> None:
    before = await env.count("SELECT count(*) FROM inbound_events")
    content_type, body = nested_form(100_000)  # ~6 MB, under the 10 MB body limit
    health: list[tuple[int, float]] = []
    done = asyncio.Event()

    async def poll_health() -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            while not done.is_set() or not health:
                started = time.monotonic()
                response = await client.get(f"{stack.relay_url}/healthz")
                health.append((response.status_code, time.monotonic() - started))
                await asyncio.sleep(0.02)

    poller = asyncio.create_task(poll_health())
    started = time.monotonic()
    refused = await env.http.post(f"{stack.relay_url}/v1/inbound/mailgun", content=body,
                                  headers={"content-type": content_type})
    elapsed = time.monotonic() - started
    done.set()
    await poller

    assert refused.status_code == 422, refused.text
    assert "nested multipart" in refused.json()["message"]
    assert elapsed < 1.0, f"refused after {elapsed:.2f} s"
    assert health and all(status == 200 and took < 1.0 for status, took in health), health
    assert await env.count("SELECT count(*) FROM inbound_events") == before


async def test_a_20_mb_login_body_is_refused_before_it_was_sent(stack: Stack) -> None:
    """With Content-Length: the 413 arrives while not one byte of the body was sent. Without
    (chunked): it arrives while the sender is still far from 20 MB."""
    address = urlsplit(stack.relay_url)
    assert address.hostname and address.port

    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    writer.write(f"POST /review/login HTTP/1.1\r\nHost: relay\r\nContent-Type: "
                 f"application/x-www-form-urlencoded\r\nContent-Length: {TWENTY_MB}\r\n"
                 "\r\n".encode())
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    assert status_line.split()[1] == b"413", status_line

    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    writer.write(b"POST /review/login HTTP/1.1\r\nHost: relay\r\nContent-Type: "
                 b"application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n")
    sent = 0
    chunk = b"10000\r\n" + b"t" * 0x10000 + b"\r\n"

    async def send_all() -> None:
        nonlocal sent
        while sent < TWENTY_MB:
            writer.write(chunk)
            await writer.drain()
            sent += 0x10000
            await asyncio.sleep(0)  # let the reader see an answer as soon as it comes

    sender = asyncio.create_task(send_all())
    try:
        status_line = await asyncio.wait_for(reader.readline(), 10)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()
    assert status_line.split()[1] == b"413", status_line
    assert sent < TWENTY_MB // 4, f"{sent} bytes sent before the answer"


async def test_credentials_write_only_into_their_tenants(env: StackClient, stack: Stack) -> None:
    globex_secret = stack.env["INBOXCRM_WEBHOOK_SECRET_GLOBEX"]
    raw = message_from(unique_email("bound"))

    shared = f"globex-shared-{uuid.uuid4().hex}"
    refused = await env.post(raw, shared, tenant="globex", mailbox="hello@globex.test",
                             secret=stack.env["INBOXCRM_WEBHOOK_SECRET"])
    assert refused.status_code == 403, refused.text
    assert refused.json()["status"] == "error"
    assert await stored(env, shared) == 0

    crossed = f"acme-globex-secret-{uuid.uuid4().hex}"
    wrong_way = await env.post(raw, crossed, secret=globex_secret)  # tenant acme
    assert wrong_way.status_code == 403, wrong_way.text
    assert await stored(env, crossed) == 0

    own = f"globex-own-{uuid.uuid4().hex}"
    accepted = await env.post(raw, own, tenant="globex", mailbox="hello@globex.test",
                              secret=globex_secret)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["status"] == "accepted"
    assert await stored(env, own) == 1
    workflow_id = accepted.json()["workflow_id"]
    assert workflow_id == f"inbound/globex/standard/hello@globex.test/{own}"
    # globex requires sender authentication: the unauthenticated sender waits for a person.
    await env.wait_state(workflow_id, "awaiting_review")
    await env.signal(workflow_id, "reject", {"reviewer": "ops"})
    await env.wait_state(workflow_id, "rejected")


async def test_provider_credentials_do_not_reach_unbound_tenants(
    env: StackClient, stack: Stack,
) -> None:
    """The shared Postmark pair and Mailgun key are bound to acme and rehearsal only; an
    envelope recipient of globex is a 403 whatever the headers say, and nothing is stored."""
    from tests.test_sources import mailgun, postmark, signed

    before = await env.count("SELECT count(*) FROM inbound_events WHERE tenant = 'globex'")
    payload = postmark(sender=unique_email("pm-globex"))
    payload["OriginalRecipient"] = "hello@globex.test"
    by_postmark = await env.http.post(
        f"{stack.relay_url}/v1/inbound/postmark", json=payload, params={"tenant": "globex"},
        auth=(stack.env["INBOXCRM_POSTMARK_USER"], stack.env["INBOXCRM_POSTMARK_PASSWORD"]))
    form = mailgun(sender=unique_email("mg-globex"))
    form["recipient"] = "hello@globex.test"
    by_mailgun = await env.http.post(f"{stack.relay_url}/v1/inbound/mailgun",
                                     data=signed(form, stack.env["INBOXCRM_MAILGUN_SIGNING_KEY"]))

    assert (by_postmark.status_code, by_mailgun.status_code) == (403, 403)
    assert await env.count("SELECT count(*) FROM inbound_events WHERE tenant = 'globex'") == \
        before


async def test_metrics_are_on_the_internal_listener_only(env: StackClient, stack: Stack) -> None:
    public = await env.http.get(f"{stack.relay_url}/metrics")
    assert public.status_code == 404
    exported = stack.stack_env()
    assert exported["RELAY_METRICS_URL"] == stack.relay_metrics_url
    assert urlsplit(stack.relay_metrics_url).port != urlsplit(stack.relay_url).port
    internal = await env.http.get(exported["RELAY_METRICS_URL"])
    assert internal.status_code == 200
    assert "inboxcrm_deliveries_received_total" in internal.text
    assert exported["INBOXCRM_WEBHOOK_SECRET_GLOBEX"] == \
        stack.env["INBOXCRM_WEBHOOK_SECRET_GLOBEX"]
