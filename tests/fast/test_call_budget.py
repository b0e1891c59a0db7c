"""The budget of calls per second that never waits (inboxcrm/platform/call_budget.py)."""

from __future__ import annotations

from inboxcrm.platform.call_budget import CallBudget


def test_a_burst_then_the_rate() -> None:
    now = [0.0]
    budget = CallBudget(2.0, clock=lambda: now[0])
    assert [budget.take() for _ in range(3)] == [True, True, False]  # a second's worth
    now[0] += 0.5
    assert [budget.take() for _ in range(2)] == [True, False]
    now[0] += 100.0  # an idle spell refills only up to the burst
    assert sum(budget.take() for _ in range(10)) == 2


def test_a_slow_rate_still_allows_one_call_and_zero_allows_none() -> None:
    now = [0.0]
    slow = CallBudget(0.1, clock=lambda: now[0])
    assert [slow.take(), slow.take()] == [True, False]
    now[0] += 10.0
    assert slow.take()
    assert not CallBudget(0.0).take()
