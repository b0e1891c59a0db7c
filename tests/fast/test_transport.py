"""The adapters' aiohttp transport, against real sockets: answers arrive intact, and every
failure is reported as the httpx error that says whether the request can have been sent
(the classifier's "transient" vs "unknown outcome" rests on it)."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from inboxcrm.adapters.errors import Category, classify_exception
from inboxcrm.adapters.transport import AiohttpTransport, new_client
from tests.helpers.tls import self_signed_certificate

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> str:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for server in servers:
        server.close()


async def test_answer_arrives_intact_and_is_decompressed(serve) -> None:  # type: ignore[no-untyped-def]
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                seen.append(await _read_request(reader))
            except asyncio.IncompleteReadError:
                break
            body = gzip.compress(json.dumps({"id": "rec-1"}).encode())
            writer.write(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                         b"Content-Encoding: gzip\r\nX-Request-Id: r1\r\nSet-Cookie: s=1\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
        writer.close()

    url = await serve(handler)
    client = new_client(url, {"Authorization": "Bearer t"}, 5.0)
    try:
        for _ in range(2):  # the second request reuses the pooled connection
            response = await client.post("/v1/things", json={"a": 1},
                                         headers={"Idempotency-Key": "k1"})
            assert response.status_code == 201
            assert response.json() == {"id": "rec-1"}
            assert response.headers["x-request-id"] == "r1"
            assert "content-encoding" not in response.headers
    finally:
        await client.aclose()
    assert len(seen) == 2
    first = seen[0].decode()
    assert first.startswith("POST /v1/things HTTP/1.1\r\n")
    assert "authorization: bearer t" in first.lower()
    assert "idempotency-key: k1" in first.lower()
    assert first.endswith('{"a":1}')
    # No jar keeps the cookie (httpx's is NoCookies, aiohttp's is off): an answer for one
    # tenant never sets anything the next request, perhaps another tenant's, carries.
    assert "\r\ncookie:" not in seen[1].decode().lower()


async def _failure(client: httpx.AsyncClient, expected: type[httpx.TransportError]) -> Category:
    """Post once, expect `expected`, and return how the classifier files it."""
    try:
        with pytest.raises(expected) as caught:
            await client.post("/x", json={})
    finally:
        await client.aclose()
    return classify_exception(caught.value).category


async def test_refused_connection_was_not_sent() -> None:
    # A bound socket that does not listen: the port is ours, and a connect is refused.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        client = new_client(f"http://127.0.0.1:{port}", {}, 2.0)
        assert await _failure(client, httpx.ConnectError) is Category.TRANSIENT


async def test_disconnect_after_the_request_is_an_unknown_outcome(serve) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)  # the request arrived; the answer never leaves
        writer.close()

    client = new_client(await serve(handler), {}, 5.0)
    assert await _failure(client, httpx.RemoteProtocolError) is Category.UNKNOWN


async def test_read_timeout_is_an_unknown_outcome(serve) -> None:  # type: ignore[no-untyped-def]
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await release.wait()
        writer.close()

    client = new_client(await serve(handler), {}, 0.5)
    try:
        assert await _failure(client, httpx.ReadTimeout) is Category.UNKNOWN
    finally:
        release.set()


async def test_no_pooled_connection_in_time_was_not_sent(serve) -> None:  # type: ignore[no-untyped-def]
    release = asyncio.Event()
    arrived = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        arrived.set()
        await release.wait()
        writer.close()

    client = httpx.AsyncClient(base_url=await serve(handler),
                               timeout=httpx.Timeout(10.0, pool=0.3),
                               transport=AiohttpTransport(max_connections=1))
    try:
        busy = asyncio.create_task(client.post("/first", json={}))
        await asyncio.wait_for(arrived.wait(), 5)
        with pytest.raises(httpx.ConnectTimeout) as caught:
            await client.post("/second", json={})
        assert classify_exception(caught.value).category is Category.TRANSIENT
    finally:
        release.set()
        await asyncio.gather(busy, return_exceptions=True)
        await client.aclose()


async def test_tls_certificates_are_verified(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cert_file, key_file = self_signed_certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert_file, key_file)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # the client refused our certificate
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_tls)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        untrusting = new_client(url, {}, 5.0)
        try:
            with pytest.raises(httpx.ConnectError) as caught:  # not in the trusted CAs
                await untrusting.get("/")
        finally:
            await untrusting.aclose()
        assert classify_exception(caught.value).category is Category.TRANSIENT

        monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))  # as httpx honours it
        trusting = new_client(url, {}, 5.0)
        try:
            assert (await trusting.get("/")).json() == {}
        finally:
            await trusting.aclose()
    finally:
        server.close()
