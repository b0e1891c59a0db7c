"""Where browser tests put their screenshots, and how long they wait for the UI."""

from __future__ import annotations

from tests.helpers.stack import ROOT

ARTIFACTS = ROOT / "test-artifacts" / "ui"
# The machine has 2 cores and other suites may run beside this one.
UI_TIMEOUT_MS = 30_000
