"""Where the test stacks live and the webhook secrets they use: the shared one (bound to the
tenants whose policy lists "standard": acme, rehearsal) and globex's own."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def worker_data_dir(name: str) -> Path:
    """`.data/<name>` of this test process: each pytest-xdist worker (`make test-stack` runs
    two) gets its own PostgreSQL and its own stack, so their servers never meet."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return ROOT / ".data" / (f"{name}-{worker}" if worker else name)
TEST_WEBHOOK_SECRET = "whsec_dGVzdC1zZWNyZXQtZm9yLWluYm94Y3JtLXRlc3RzLTAwMDA="

TEST_GLOBEX_WEBHOOK_SECRET = "whsec_Z2xvYmV4LW93bi1zZWNyZXQtZm9yLWluYm94Y3JtLXRlc3RzLTE="
