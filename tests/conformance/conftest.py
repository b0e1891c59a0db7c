"""Real sandbox processes for the conformance suite: one over http with an API key (HubSpot,
Resend SDKs), one over https with a self-signed certificate (simple-salesforce speaks only
https), and one started with idempotency keys that never expire (a deliberately wrong
sandbox: the key-expiry check must fail against it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.sandbox_process import SandboxProcess, free_port, running
from tests.helpers.tls import self_signed_certificate


@pytest.fixture(scope="session")
async def sandbox(database_url: str) -> AsyncIterator[SandboxProcess]:
    async for process in running(SandboxProcess(database_url, free_port())):
        yield process


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
async def tls_sandbox(database_url: str, certificate: tuple[Path, Path]
                      ) -> AsyncIterator[SandboxProcess]:
    async for process in running(SandboxProcess(database_url, free_port(), tls=certificate)):
        yield process


@pytest.fixture(scope="session")
async def keys_never_expire(database_url: str) -> AsyncIterator[SandboxProcess]:
    process = SandboxProcess(database_url, free_port(), args=("--idempotency-key-hours", "0"))
    async for started in running(process):
        yield started


@pytest.fixture(autouse=True)
async def clean_sandbox(sandbox: SandboxProcess) -> None:
    """Empty sandbox (all processes share the database), no faults, real time."""
    async with httpx.AsyncClient(base_url=sandbox.url) as control:
        (await control.post("/_sandbox/reset")).raise_for_status()
