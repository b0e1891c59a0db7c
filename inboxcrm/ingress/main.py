"""Run the relay with uvicorn; a port already in use is a one-line error, not a traceback."""

from __future__ import annotations

import socket
import sys

import uvicorn

from inboxcrm.ingress.app import create_app
from inboxcrm.platform import tracing
from inboxcrm.platform.config import get_settings
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
    settings = get_settings()
    configure_logging("relay")
    tracing.configure("inboxcrm-relay")  # off unless OTEL_* asks (docs/architecture.md §8)
    if not port_free(settings.relay_host, settings.relay_port):
        print(  # noqa: T201
            f"inboxcrm relay: port {settings.relay_port} on {settings.relay_host} is already in "
            "use; set INBOXCRM_RELAY_PORT to another port",
            file=sys.stderr,
        )
        sys.exit(2)
    uvicorn.run(create_app(settings), host=settings.relay_host, port=settings.relay_port,
                log_level="warning")


if __name__ == "__main__":
    main()
