"""Run the relay with uvicorn; a port already in use is a one-line error, not a traceback."""

from __future__ import annotations

import logging
import socket
import sys

import uvicorn

from inboxcrm.ingress.app import create_app
from inboxcrm.platform import atrest, tracing
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
    tracing.configure("inboxcrm-relay")  # off unless OTEL_* asks (docs/architecture.md §8)
    try:
        settings = get_settings()
        atrest.require_sealer(settings)  # no key file in production: exit 2, one line
        app = create_app(settings)
    except (InsecureSetting, ValueError) as exc:  # a weak or malformed credential
        logging.getLogger("inboxcrm.relay").error("inboxcrm relay: %s", exc)
        sys.exit(2)
    if not port_free(settings.relay_host, settings.relay_port):
        logging.getLogger("inboxcrm.relay").error(
            "inboxcrm relay: port %s on %s is already in use; set INBOXCRM_RELAY_PORT to "
            "another port", settings.relay_port, settings.relay_host)
        sys.exit(2)
    metrics_host, _, metrics_port = settings.relay_metrics_address.rpartition(":")
    if settings.relay_metrics_address and not port_free(metrics_host, int(metrics_port)):
        logging.getLogger("inboxcrm.relay").error(
            "inboxcrm relay: metrics address %s is already in use; set "
            "INBOXCRM_RELAY_METRICS_ADDRESS to another host:port (empty: off)",
            settings.relay_metrics_address)
        sys.exit(2)
    uvicorn.run(app, host=settings.relay_host, port=settings.relay_port,
                log_level="warning")


if __name__ == "__main__":
    main()
