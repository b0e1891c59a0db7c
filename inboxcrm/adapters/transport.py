"""The adapters' HTTP transport: httpx's API over aiohttp's connection pool and C parser.

Adapters keep speaking httpx (`send_request`, `httpx.Response`, and httpx exceptions for
the one classifier in `inboxcrm.adapters.errors`); only the wire work moves to aiohttp, which
costs the worker about a third of the CPU per request of httpx's own pure-Python stack
(httpcore, h11, anyio).

The exception mapping is the part that matters for safety. The classifier decides from
the httpx exception type whether a request can have reached the destination:
- nothing was sent (no connection, connect timeout, no pooled connection in time)
  → `httpx.ConnectError` / `httpx.ConnectTimeout`: a plain retry is safe;
- anything after the request may have been written (disconnect, read timeout, broken
  response, an error we do not know) → `httpx.ReadTimeout` / `httpx.RemoteProtocolError` /
  `httpx.ReadError`: the outcome is unknown and the ledger reconciles before retrying.
Unrecognised errors are deliberately mapped to "maybe sent".
"""

from __future__ import annotations

import socket
from http.cookiejar import Cookie, CookieJar
from typing import Any

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult

from inboxcrm.adapters.errors import AddressRefused
from inboxcrm.schemas.destinations import DestinationRules, address_is_internal

# Response headers that describe the wire encoding aiohttp already undid.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})
# Request headers aiohttp sets itself: the body's length, and the encodings it can decode.
_COMPUTED_HEADERS = frozenset({"content-length", "transfer-encoding", "accept-encoding"})


class _Refused(OSError):
    """A resolved address the guard refuses (raised inside aiohttp's connect)."""


class AddressGuard:
    """The connect-time check of a tenant's destination (schemas/destinations.py): every
    address a host resolves to must be public, unless the operator allows the host (or the
    address) in INBOXCRM_DESTINATION_HOSTS_ALLOWED. Checked on what DNS answers when the
    connection is made, so a name that resolves to 169.254.169.254 or 10.x is refused before
    anything is sent."""

    def __init__(self, rules: DestinationRules) -> None:
        self.rules = rules

    def refuses(self, host: str, address: str) -> bool:
        if self.rules.host_allowed(host):
            return False
        return address_is_internal(address) and not self.rules.address_allowed(address)


class _GuardedResolver(AbstractResolver):
    def __init__(self, guard: AddressGuard) -> None:
        self._guard = guard
        self._inner = aiohttp.DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if any(self._guard.refuses(host, r["host"]) for r in found):
            raise _Refused(f"{host} resolves to an internal address")
        return found

    async def close(self) -> None:
        await self._inner.close()


def to_httpx_error(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
    """The httpx exception that says as much as we know about whether `request` was sent."""
    message = type(exc).__name__
    if isinstance(getattr(exc, "os_error", None), _Refused):
        return AddressRefused(message, request=request)
    not_sent: type[httpx.TransportError] | None = None
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        not_sent = httpx.ConnectTimeout  # connect (or waiting for a pooled connection)
    elif isinstance(exc, aiohttp.ClientConnectorError):
        not_sent = httpx.ConnectError  # refused, DNS, TLS handshake: nothing written
    elif isinstance(exc, aiohttp.InvalidURL):
        not_sent = httpx.UnsupportedProtocol
    if not_sent is not None:
        return not_sent(message, request=request)
    if isinstance(exc, aiohttp.ServerTimeoutError | TimeoutError):
        return httpx.ReadTimeout(message, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError
                  | aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(message, request=request)
    return httpx.ReadError(message, request=request)


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One aiohttp session (created on first use, inside the event loop), pooled
    keep-alive connections, whole responses read before they are returned (API answers
    are small), no redirects, no retries: a retry is the ledger's decision."""

    def __init__(self, *, max_connections: int = 100,
                 guard: AddressGuard | None = None) -> None:
        self._max_connections = max_connections
        self._guard = guard
        self._session: aiohttp.ClientSession | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # httpx's TLS defaults (certifi CAs, SSL_CERT_FILE / SSL_CERT_DIR honoured), so
            # certificate verification is what it was before this transport.
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, ssl=httpx.create_ssl_context(),
                resolver=_GuardedResolver(self._guard) if self._guard else None)
            # Cookies are httpx's business, and its jar keeps none (NoCookies).
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=True, skip_auto_headers=("User-Agent",),
                cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            total=None, connect=timeouts.get("pool"), sock_connect=timeouts.get("connect"),
            sock_read=timeouts.get("read"))
        headers = [(k, v) for k, v in request.headers.multi_items()
                   if k.lower() not in _COMPUTED_HEADERS]
        host = request.url.host
        if self._guard is not None and self._guard.refuses(host, host):
            # An address literal never reaches the resolver: checked here, nothing sent.
            raise AddressRefused("internal address", request=request)
        body = await request.aread()
        try:
            async with self._session_now().request(
                request.method, str(request.url), headers=headers, data=body or None,
                allow_redirects=False, timeout=timeout,
            ) as response:
                content = await response.read()
                status = response.status
                response_headers: list[tuple[str, str]] = [
                    (k, v) for k, v in response.headers.items() if k.lower() not in _WIRE_HEADERS]
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise to_httpx_error(exc, request) from exc
        return httpx.Response(status, headers=response_headers, content=content,
                              request=request, extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class NoCookies(CookieJar):
    """A jar that keeps nothing. Provider APIs authenticate by header, and a client may serve
    several tenants: a cookie one tenant's answer sets (a CDN's bot-management cookie, say)
    must never ride on another tenant's request. Parsing every Set-Cookie for nothing also
    cost a few hundred microseconds per item."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: Cookie) -> None:
        return None


def new_client(base_url: str, headers: dict[str, str], timeout: float,
               guard: AddressGuard | None = None, **options: Any) -> httpx.AsyncClient:
    """The httpx client every HTTP adapter uses (see the module docstring); a tenant's own
    destination passes its `guard`."""
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout,
                             transport=AiohttpTransport(guard=guard), cookies=NoCookies(),
                             **options)
