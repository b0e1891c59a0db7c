"""The operator CLI run as an operator would: a subprocess against a test stack."""

from __future__ import annotations

import json
import subprocess
import sys

from inboxcrm.stack.stack import Stack


def cli(stack: Stack, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the operator CLI against the test stack, as an operator would (`timeout`: room
    for a long command such as `rehearse`)."""
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=stack.env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def add_reviewer(stack: Stack, name: str, role: str) -> str:
    """A reviewer of acme with `role`; returns the token the CLI signs decisions with."""
    added = cli(stack, "reviewer", "add", name, "--tenant", "acme", "--role", role, "--json")
    assert added.returncode == 0, added.stderr
    body = json.loads(added.stdout)
    assert body["role"] == role
    return str(body["token"])


def as_reviewer(stack: Stack, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The operator CLI signed in as the reviewer whose token this is."""
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args],
                          env=stack.env | {"INBOXCRM_REVIEWER_TOKEN": token},
                          capture_output=True, text=True, timeout=60, check=False)
