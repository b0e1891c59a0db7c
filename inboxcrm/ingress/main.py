"""Run the relay with uvicorn; a port already in use is a one-line error, not a traceback."""

from __future__ import annotations

import socket
import sys

import uvicorn

from inboxcrm.ingress.app import create_app
from inboxcrm.platform.config import InsecureSetting, get_settings
from inboxcrm.platform.logs import configure_logging


def port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def main() -> None:
    configure_logging("relay")
    try:
        settings = get_settings()
        app = create_app(settings)
    except (InsecureSetting, ValueError) as exc:  # a weak or malformed credential
        print(f"inboxcrm relay: {exc}", file=sys.stderr)  # noqa: T201
        sys.exit(2)
    if not port_free(settings.relay_host, settings.relay_port):
        print(  # noqa: T201
            f"inboxcrm relay: port {settings.relay_port} on {settings.relay_host} is already in "
            "use; set INBOXCRM_RELAY_PORT to another port",
            file=sys.stderr,
        )
        sys.exit(2)
    metrics_host, _, metrics_port = settings.relay_metrics_address.rpartition(":")
    if settings.relay_metrics_address and not port_free(metrics_host, int(metrics_port)):
        print(  # noqa: T201
            f"inboxcrm relay: metrics address {settings.relay_metrics_address} is already in "
            "use; set INBOXCRM_RELAY_METRICS_ADDRESS to another host:port (empty: off)",
            file=sys.stderr,
        )
        sys.exit(2)
    uvicorn.run(app, host=settings.relay_host, port=settings.relay_port,
                log_level="warning")


if __name__ == "__main__":
    main()
