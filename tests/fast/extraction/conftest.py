from __future__ import annotations

from collections.abc import Iterator

import pytest

from inboxcrm.domain.policy import TenantPolicy, get_policy
from tests.helpers.llm_stub import StubServer


@pytest.fixture(scope="session")
def llm_stub() -> Iterator[StubServer]:
    server = StubServer().start()
    yield server
    server.stop()


@pytest.fixture
def acme(monkeypatch: pytest.MonkeyPatch) -> TenantPolicy:
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    return get_policy("acme")
