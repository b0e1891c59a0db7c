"""Where the test stacks live and the webhook secret they share."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_WEBHOOK_SECRET = "whsec_dGVzdC1zZWNyZXQtZm9yLWluYm94Y3JtLXRlc3RzLTAwMDA="

