"""The operator CLI run as an operator would: a subprocess against a test stack."""

from __future__ import annotations

import subprocess
import sys

from inboxcrm.stack.stack import Stack


def cli(stack: Stack, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the operator CLI against the test stack, as an operator would (`timeout`: room
    for a long command such as `rehearse`)."""
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=stack.env,
                          capture_output=True, text=True, timeout=timeout, check=False)
