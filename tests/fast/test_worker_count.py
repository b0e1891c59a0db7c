"""How many worker processes `make up` starts: one per core unless INBOXCRM_WORKERS says."""

from __future__ import annotations

import dataclasses
import re

import pytest

from inboxcrm.stack.processes import StackError
from inboxcrm.stack.stack import Stack, StackConfig, worker_count, worker_name


@pytest.mark.parametrize("cpus, expected", [(8, 8), (2, 2), (1, 1), (None, 1)])
def test_one_worker_per_core_by_default(cpus: int | None, expected: int) -> None:
    assert worker_count({}, cpus) == expected
    assert worker_count({"INBOXCRM_WORKERS": "  "}, cpus) == expected


@pytest.mark.parametrize("value, expected", [("1", 1), ("3", 3), (" 12 ", 12)])
def test_the_variable_overrides_the_core_count(value: str, expected: int) -> None:
    assert worker_count({"INBOXCRM_WORKERS": value}, 2) == expected


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", "2e0"])
def test_anything_but_a_positive_whole_number_is_a_clear_error(value: str) -> None:
    with pytest.raises(StackError, match="INBOXCRM_WORKERS must be a whole number of at least 1"
                       ) as excinfo:
        worker_count({"INBOXCRM_WORKERS": value}, 4)
    assert repr(value) in str(excinfo.value)


def test_each_worker_has_its_own_name_and_metrics_port_around_the_relays() -> None:
    """The defaults put the relay's metrics on 9465, next to the first worker's 9464: the
    second worker goes past it (round three gave it 9465 and `make up` failed on 2 cores)."""
    stack = Stack(StackConfig(worker_metrics_port=9464, relay_metrics_port=9465, workers=3))
    assert [worker_name(i) for i in (1, 2, 3)] == ["worker", "worker-2", "worker-3"]
    assert [stack.worker_metrics_address(i) for i in (1, 2, 3)] == [
        "127.0.0.1:9464", "127.0.0.1:9466", "127.0.0.1:9467"]


CONFIGS = {
    "defaults": StackConfig(),
    "workers just below the relay": StackConfig(worker_metrics_port=8070),
    "workers through the sandbox and relay": StackConfig(worker_metrics_port=8085),
    "external PostgreSQL and Temporal": StackConfig(database_url="postgresql://db/x",
                                                    temporal_address="temporal:7233",
                                                    worker_metrics_port=7230),
}


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("workers", range(1, 65))
def test_no_two_listeners_of_the_stack_share_a_port(name: str, workers: int) -> None:
    config = dataclasses.replace(CONFIGS[name], workers=workers)
    stack = Stack(config)
    plan = stack.port_plan()
    ports = plan.all_ports()
    assert len(ports) == len(set(ports)), plan
    assert len(plan.workers) == workers
    addresses = [stack.worker_metrics_address(i) for i in range(1, workers + 1)]
    assert addresses == [f"127.0.0.1:{port}" for port in plan.workers]
    # What the stack actually binds: the relay, sandbox, PostgreSQL and Temporal ports it
    # starts, and every worker's metrics listener (the stack.env it writes names them all).
    bound = {config.relay_port, config.relay_metrics_port, config.sandbox_port}
    if not config.database_url:
        bound.add(config.pg_port)
    if not config.temporal_address:
        bound |= {config.temporal_port, config.temporal_ui_port or 0}
    assert not bound & set(plan.workers)


def test_a_further_worker_gets_a_port_no_other_listener_has() -> None:
    stack = Stack(StackConfig(workers=2))
    assert stack.worker_metrics_address(3) == "127.0.0.1:9467"
    assert stack.worker_metrics_address(3) not in {stack.worker_metrics_address(i)
                                                    for i in (1, 2)}


@pytest.mark.parametrize("config, message", [
    (StackConfig(relay_port=8090), "INBOXCRM_SANDBOX_PORT and INBOXCRM_RELAY_PORT both name "
                                   "port 8090"),
    (StackConfig(worker_metrics_port=9465), "INBOXCRM_RELAY_METRICS_PORT and "
                                            "INBOXCRM_WORKER_METRICS_PORT both name port 9465"),
    (StackConfig(temporal_ui_port=7233), "INBOXCRM_TEMPORAL_PORT and INBOXCRM_TEMPORAL_UI_PORT "
                                         "both name port 7233"),
    (StackConfig(worker_metrics_port=65534, workers=3), "3 workers need 3 metrics ports"),
    (StackConfig(relay_port=70000), "INBOXCRM_RELAY_PORT=70000 is not a TCP port"),
])
def test_a_collision_between_two_settings_is_said_as_exactly_that(
        config: StackConfig, message: str) -> None:
    with pytest.raises(StackError, match=re.escape(message)):
        Stack(config).check_ports()


def test_a_port_the_stack_does_not_start_is_no_collision() -> None:
    """With DATABASE_URL set, the embedded PostgreSQL's port is nobody's."""
    Stack(StackConfig(database_url="postgresql://db/x", pg_port=8080)).check_ports()
