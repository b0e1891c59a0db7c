"""Container probes without curl (the image has none):

    python deploy/healthcheck.py relay   # GET http://127.0.0.1:$INBOXCRM_RELAY_PORT/readyz == 200
    python deploy/healthcheck.py ready   # TCP reachability of Temporal and PostgreSQL (worker)

`relay` asks the relay's readiness route, which needs PostgreSQL only: the relay stores
deliveries while Temporal is down, and its sweeper starts them later. `ready` tells whether
this worker can reach what it needs, at the addresses the worker itself connects to (the
Temporal client profile and the overrides of `inboxcrm.platform.temporal.connect_config`,
the database URL of the settings). Neither restarts anything (a dependency outage must not
turn into a restart storm): use them for readiness and Compose health, not for liveness.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit

TIMEOUT = 3.0


def relay() -> bool:
    port = os.environ.get("INBOXCRM_RELAY_PORT", "8080")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=TIMEOUT) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT):
            return True
    except OSError:
        return False


def _host_port(address: str, default_port: int) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host or address).strip("[]"), int(port or default_port)


def targets() -> list[tuple[str, int]]:
    """(host, port) of Temporal and of PostgreSQL, as the worker's settings resolve them."""
    from inboxcrm.platform.config import Settings
    from inboxcrm.platform.temporal import connect_config

    settings = Settings()
    database = urlsplit(settings.database_url)
    return [_host_port(connect_config(settings).target_host, 7233),
            (database.hostname or "127.0.0.1", database.port or 5432)]


def ready() -> bool:
    try:
        found = targets()
    except Exception:  # noqa: BLE001 - settings the worker could not start with: not ready
        return False
    return all(_reachable(host, port) for host, port in found)


if __name__ == "__main__":
    checks = {"relay": relay, "ready": ready}
    if len(sys.argv) != 2 or sys.argv[1] not in checks:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(checks)}")
    sys.exit(0 if checks[sys.argv[1]]() else 1)
