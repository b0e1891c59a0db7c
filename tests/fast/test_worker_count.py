"""How many worker processes `make up` starts: one per core unless INBOXCRM_WORKERS says."""

from __future__ import annotations

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


def test_each_worker_has_its_own_name_and_metrics_port() -> None:
    stack = Stack(StackConfig(worker_metrics_port=9464, workers=3))
    assert [worker_name(i) for i in (1, 2, 3)] == ["worker", "worker-2", "worker-3"]
    assert [stack.worker_metrics_address(i) for i in (1, 2, 3)] == [
        "127.0.0.1:9464", "127.0.0.1:9465", "127.0.0.1:9466"]
