"""Container probes with the standard library only (the image has no curl):

    python deploy/healthcheck.py relay   # GET http://127.0.0.1:$INBOXCRM_RELAY_PORT/healthz == 200
    python deploy/healthcheck.py ready   # TCP reachability of Temporal and PostgreSQL (worker)

`ready` tells whether this worker can reach what it needs; it deliberately does not restart
anything (a dependency outage must not turn into a restart storm): use it for readiness and
Compose health, not for liveness.
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


def ready() -> bool:
    temporal = os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233")
    t_host, _, t_port = temporal.rpartition(":")
    database = urlsplit(os.environ.get("DATABASE_URL", "postgresql://127.0.0.1:5432/"))
    return _reachable(t_host or temporal, int(t_port or 7233)) and _reachable(
        database.hostname or "127.0.0.1", database.port or 5432)


if __name__ == "__main__":
    checks = {"relay": relay, "ready": ready}
    if len(sys.argv) != 2 or sys.argv[1] not in checks:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(checks)}")
    sys.exit(0 if checks[sys.argv[1]]() else 1)
