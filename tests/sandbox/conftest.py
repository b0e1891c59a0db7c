"""A real sandbox process (`python -m sandbox`) on loopback, shared by the sandbox tests.

The process gets an API key so auth is exercised; `client` carries it, `anon` does not.
Each test starts from an empty sandbox with short, known timings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.helpers.sandbox_process import (
    API_KEY,
    HANG,
    SEARCH_LAG,
    SandboxProcess,
    free_port,
    running,
)


@pytest.fixture(scope="session")
async def sandbox_process(database_url: str) -> AsyncIterator[SandboxProcess]:
    async for process in running(SandboxProcess(database_url, free_port())):
        yield process


@pytest.fixture(scope="session")
async def client(sandbox_process: SandboxProcess) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(
        base_url=sandbox_process.url, headers=headers, timeout=10.0
    ) as http:
        yield http


@pytest.fixture(scope="session")
async def anon(sandbox_process: SandboxProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sandbox_process.url, timeout=10.0) as http:
        yield http


@pytest.fixture(autouse=True)
async def clean_sandbox(anon: httpx.AsyncClient) -> None:
    """Empty sandbox, no faults, known timings: tests never see each other's records."""
    (await anon.post("/_sandbox/reset")).raise_for_status()
    config = {"search_lag_seconds": SEARCH_LAG, "hang_seconds": HANG,
              "salesforce_duplicate_rule": "alert"}
    (await anon.post("/_sandbox/config", json=config)).raise_for_status()
