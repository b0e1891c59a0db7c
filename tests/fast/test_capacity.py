"""The capacity model (bench/capacity.py, docs/capacity.md) on the committed benchmark
results: it reads the measured per-item costs, not constants of its own."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench import capacity


@pytest.fixture(scope="module")
def costs() -> capacity.Costs:
    return capacity.costs_from(json.loads(capacity.LATEST.read_text()), "latest.json")


def test_costs_come_from_the_measured_run(costs: capacity.Costs) -> None:
    result = json.loads(capacity.LATEST.read_text())
    measured = result["throughput"]["cpu_per_item"]["product"]
    assert costs.worker_cpu_ms == pytest.approx(measured["workers"])
    assert costs.db_round_trips > 0 and costs.history_events > 0
    assert costs.actions_high >= costs.actions_low >= 1  # at least the workflow start


def test_a_deployment_for_10_100_and_1000_emails_per_second(costs: capacity.Costs) -> None:
    plans = [capacity.plan(costs, rate) for rate in (10, 100, 1000)]
    workers = [p.worker_replicas for p in plans]
    assert workers == sorted(workers) and workers[-1] > workers[0]
    big = plans[-1]
    assert big.worker_replicas >= 1000 * costs.worker_cpu_ms / 1000  # cores, at least
    assert big.cloud_actions_per_second[1] == pytest.approx(1000 * costs.actions_high, rel=1e-3)
    # The binding limit is named, tightest first.
    assert [rate for _, rate in big.binding] == sorted(rate for _, rate in big.binding)
    # One tenant's provider accounts cannot carry 1,000 emails/s: tenants are needed.
    assert big.tenants_needed > 1


def test_the_model_follows_the_measurements(costs: capacity.Costs) -> None:
    heavier = dataclasses.replace(costs, worker_cpu_ms=costs.worker_cpu_ms * 2,
                                  postgres_cpu_ms=costs.postgres_cpu_ms * 100)
    base, more = capacity.plan(costs, 1000), capacity.plan(heavier, 1000)
    assert more.worker_replicas_for_cpu >= 2 * base.worker_replicas_for_cpu - 1
    assert more.db_shards > base.db_shards


def test_the_command_prints_each_rate_and_what_binds(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    assert capacity.main(["--results", str(capacity.LATEST)]) == 0
    out = capsys.readouterr().out
    for rate in ("10 emails/s", "100 emails/s", "1000 emails/s"):
        assert rate in out
    assert out.count("binds first") == 3


def test_postgres_is_charged_by_share_only_where_the_stand_in_shared_the_server() -> None:
    """Runs where the sandbox shared the product's PostgreSQL charge the product its share of
    round trips; runs where the sandbox had a server of its own (`sandbox-postgres`) charge
    it the whole of its own server."""
    result = json.loads(capacity.LATEST.read_text())
    cpu = result["throughput"]["cpu_per_item"]["product"]
    pg = result["throughput"]["profiled_run"]["postgres"]
    pg["product"]["round_trips_per_item"], pg["sandbox"] = 30.0, {"round_trips_per_item": 10.0}
    cpu.pop("sandbox-postgres", None)
    cpu["postgres"] = 8.0
    shared = capacity.costs_from(result, "shared")
    assert shared.postgres_cpu_ms == pytest.approx(6.0)
    cpu["sandbox-postgres"] = 4.0
    own = capacity.costs_from(result, "own")
    assert own.postgres_cpu_ms == pytest.approx(8.0)


def test_slow_providers_bind_the_workers_slots_before_their_cpu(costs: capacity.Costs) -> None:
    """An item holds its slot through its provider calls: at a real API's latency 6 slots
    a worker bind before one core does, and more slots (or faster providers) undo it."""
    slow = capacity.plan(costs, 1000, limits=capacity.Limits(provider_latency_ms=250))
    calls = costs.crm_calls + costs.mail_calls
    assert slow.item_seconds == pytest.approx(costs.worker_cpu_ms / 1000 + calls * 0.25,
                                              abs=1e-3)
    assert slow.worker_replicas_for_slots > slow.worker_replicas_for_cpu
    assert slow.worker_replicas == slow.worker_replicas_for_slots
    instant = capacity.plan(costs, 1000, limits=capacity.Limits(provider_latency_ms=0))
    assert instant.worker_replicas == instant.worker_replicas_for_cpu
    wide = capacity.plan(costs, 1000, limits=capacity.Limits(slots_per_worker=50))
    assert wide.worker_replicas_for_slots < slow.worker_replicas_for_slots
