"""The relay's per-tenant intake rate (inboxcrm.ingress.admission) and the fairness key items
start with (inboxcrm.domain.policy.tenant_priority), read from the tenant's policy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inboxcrm.domain import policy as policy_module
from inboxcrm.domain.policy import PolicyError, load_policies, tenant_priority
from inboxcrm.ingress.admission import Admission

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def policies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "policies"
    shutil.copytree(ROOT / "policies", directory)
    acme = json.loads((directory / "acme.json").read_text())
    acme["capacity"] = {"intake_per_second": 2, "intake_burst": 3, "fairness_weight": 4}
    (directory / "acme.json").write_text(json.dumps(acme))
    monkeypatch.setenv("INBOXCRM_POLICY_DIR", str(directory))
    monkeypatch.setattr(policy_module, "_recent", None)
    return directory


def test_a_burst_is_admitted_then_the_rate_with_a_retry_after(policies: Path) -> None:
    clock = Clock()
    admission = Admission(clock=clock)
    assert [admission.retry_after("acme") for _ in range(3)] == [None, None, None]
    assert admission.retry_after("acme") == 1
    clock.now += 0.5  # one token back at 2 per second
    assert admission.retry_after("acme") is None
    assert admission.retry_after("acme") == 1
    clock.now += 60  # refills to the burst, never past it
    assert [admission.retry_after("acme") for _ in range(4)] == [None, None, None, 1]


def test_a_tenant_without_a_rate_and_another_tenant_are_not_held(policies: Path) -> None:
    admission = Admission(clock=Clock())
    for _ in range(3):
        admission.retry_after("acme")
    assert admission.retry_after("acme") == 1
    assert all(admission.retry_after("globex") is None for _ in range(1000))
    assert admission.retry_after("nobody") is None  # refused later, for its own reason


def test_a_slow_rate_asks_for_a_longer_wait(policies: Path) -> None:
    acme = json.loads((policies / "acme.json").read_text())
    acme["capacity"] = {"intake_per_second": 0.1, "intake_burst": 1}
    (policies / "acme.json").write_text(json.dumps(acme))
    admission = Admission(clock=Clock())
    assert admission.retry_after("acme") is None
    assert admission.retry_after("acme") == 10


def test_items_start_with_the_tenant_as_fairness_key_and_its_weight(policies: Path) -> None:
    priority = tenant_priority("acme")
    assert (priority.fairness_key, priority.fairness_weight) == ("acme", 4)
    assert tenant_priority("globex").fairness_weight == 1.0
    assert tenant_priority("nobody").fairness_key == "nobody"


@pytest.mark.parametrize("capacity", [{"fairness_weight": 0}, {"fairness_weight": 1001},
                                      {"intake_per_second": 0}, {"intake_burst": 0},
                                      {"intake_rate": 5}])
def test_a_capacity_outside_what_temporal_and_the_relay_allow_is_refused(
        policies: Path, capacity: dict[str, float]) -> None:
    acme = json.loads((policies / "acme.json").read_text())
    acme["capacity"] = capacity
    (policies / "acme.json").write_text(json.dumps(acme))
    with pytest.raises(PolicyError):
        load_policies(policies)
