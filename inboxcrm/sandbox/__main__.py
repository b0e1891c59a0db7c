"""`python -m sandbox [--host H] [--port P]`: serve the sandbox with uvicorn.

Settings come from DATABASE_URL, SANDBOX_SEARCH_LAG_SECONDS, SANDBOX_HANG_SECONDS and
SANDBOX_API_KEY; flags override them. `--ssl-certfile`/`--ssl-keyfile` serve https (clients
that speak only https, such as simple-salesforce). `--idempotency-key-hours` is how long a
Resend idempotency key is kept (24, as Resend; 0 keeps keys for ever, a debug setting that
the conformance suite must catch). Start-up problems (port taken, database
unreachable, bad settings) are one line on stderr, not a traceback: exit 2 for usage and
port problems, 1 when the database cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import socket
import sys

import asyncpg
import uvicorn

from inboxcrm.sandbox.app import create_app

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090


class StartupError(Exception):
    """A start-up problem with a one-line explanation and an exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _env_float(name: str, default: float, unit: str = "seconds") -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StartupError(f"{name} must be a number of {unit}, got {raw!r}") from None
    if value < 0:
        raise StartupError(f"{name} must not be negative")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__)
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--database-url", help="default: $DATABASE_URL")
    parser.add_argument("--search-lag-seconds", type=float, help="default: 2.0")
    parser.add_argument("--hang-seconds", type=float, help="default: 30.0")
    parser.add_argument("--api-key", help="default: $SANDBOX_API_KEY (unset: no auth)")
    parser.add_argument("--ssl-certfile", help="serve https with this PEM certificate")
    parser.add_argument("--ssl-keyfile", help="the certificate's PEM private key")
    parser.add_argument("--idempotency-key-hours", type=float, default=24.0,
                        help="how long a mail idempotency key is kept (0: for ever)")
    parser.add_argument("--latency-ms", type=float, default=None,
                        help="answer every CRM and mail call this much later, as a real "
                        "API across the network does (env SANDBOX_LATENCY_MS; default 0)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="log request lines (off by default: paths may hold email addresses)",
    )
    return parser


def _bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket ourselves so a taken port is a clear error."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise StartupError(f"cannot resolve host {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(f"port {port} on {host} is already in use") from None
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


async def _probe(database_url: str) -> None:
    try:
        conn = await asyncpg.connect(database_url, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise StartupError(f"cannot connect to the database: {reason}", code=1) from None
    await conn.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        database_url = args.database_url or os.environ.get("DATABASE_URL")
        if not database_url:
            raise StartupError("DATABASE_URL is not set (or pass --database-url)")
        lag = args.search_lag_seconds
        if lag is None:
            lag = _env_float("SANDBOX_SEARCH_LAG_SECONDS", 2.0)
        hang = args.hang_seconds
        if hang is None:
            hang = _env_float("SANDBOX_HANG_SECONDS", 30.0)
        latency = args.latency_ms
        if latency is None:
            latency = _env_float("SANDBOX_LATENCY_MS", 0.0, "milliseconds")
        if lag < 0 or hang < 0 or latency < 0:
            raise StartupError("--search-lag-seconds, --hang-seconds and --latency-ms must "
                               "not be negative")
        api_key = args.api_key if args.api_key is not None else os.environ.get("SANDBOX_API_KEY")
        if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
            raise StartupError("--ssl-certfile and --ssl-keyfile go together")
        if args.idempotency_key_hours < 0:
            raise StartupError("--idempotency-key-hours must not be negative")
        sock = _bind(args.host, args.port)
        asyncio.run(_probe(database_url))
    except StartupError as exc:
        sys.stderr.write(f"sandbox: {exc}\n")
        return exc.code
    app = create_app(database_url, search_lag_seconds=lag, hang_seconds=hang, api_key=api_key,
                     key_ttl_seconds=args.idempotency_key_hours * 3600,
                     latency_seconds=latency / 1000)
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        access_log=args.access_log,
        timeout_graceful_shutdown=5,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
    )
    server = uvicorn.Server(config)
    scheme = "https" if args.ssl_certfile else "http"
    sys.stderr.write(f"sandbox: serving on {scheme}://{args.host}:{args.port}\n")
    server.run(sockets=[sock])
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
