"""Where the test stacks live and the webhook secrets they use: the shared one (bound to the
tenants whose policy lists "standard": acme, rehearsal) and globex's own."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_WEBHOOK_SECRET = "whsec_dGVzdC1zZWNyZXQtZm9yLWluYm94Y3JtLXRlc3RzLTAwMDA="

TEST_GLOBEX_WEBHOOK_SECRET = "whsec_Z2xvYmV4LW93bi1zZWNyZXQtZm9yLWluYm94Y3JtLXRlc3RzLTE="
