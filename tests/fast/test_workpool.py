"""The work pool (inboxcrm/platform/workpool.py): CPU work on untrusted input runs in child
processes, and a call that overruns its time limit is stopped by killing its child, not
waited for (docs/architecture.md §7). Real child processes; no mocks."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from inboxcrm.platform.workpool import (
    BudgetExceeded,
    InProcess,
    WorkFailed,
    WorkPool,
    WorkPoolUnavailable,
)
from inboxcrm.schemas import models
from tests.helpers import work_jobs


@pytest.fixture
async def pool() -> AsyncIterator[WorkPool]:
    async with WorkPool(processes=2, time_limit=1.0, memory_limit_mb=512) as running:
        yield running


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def _children(pool: WorkPool) -> set[int]:
    """The PIDs of every child (one call held on each at the same time)."""
    return set(await asyncio.gather(*(pool.run(work_jobs.pid_after, 0.2)
                                      for _ in range(pool.processes))))


async def _wait_dead(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        await asyncio.sleep(0.02)
    return False


async def test_runs_calls_in_other_processes(pool: WorkPool) -> None:
    assert await pool.run(work_jobs.square, 12) == 144
    pids = await _children(pool)
    assert os.getpid() not in pids and len(pids) == 2


async def test_a_runaway_call_is_killed_at_the_limit_and_its_child_replaced(
        pool: WorkPool) -> None:
    victims = await _children(pool)
    started = time.monotonic()
    with pytest.raises(BudgetExceeded) as raised:
        await pool.run(work_jobs.spin, 30.0)
    assert raised.value.reason == "time"
    assert time.monotonic() - started < 3.0  # stopped at the limit, not after 30 s
    assert pool.stats.killed == 1
    # the child that ran it is gone; the pool keeps answering with a new one
    assert await pool.run(work_jobs.square, 3) == 9
    pids = await _children(pool)
    deadline = time.monotonic() + 10
    while len(pids) < 2 and time.monotonic() < deadline:
        # The replacement may still be starting on a busy machine: until it serves, both
        # held calls land on the one child that answers.
        pids = await _children(pool)
    dead = [pid for pid in victims if not _alive(pid)]
    assert len(dead) == 1 and dead[0] not in pids and len(pids) == 2


async def test_the_event_loop_keeps_turning_while_a_child_spins(pool: WorkPool) -> None:
    lag = 0.0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal lag
        while not stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lag = max(lag, time.monotonic() - before - 0.01)

    stop = asyncio.Event()
    ticking = asyncio.create_task(ticker(stop))
    assert await pool.run(work_jobs.spin, 0.5) == "finished"
    stop.set()
    await ticking
    assert lag < 0.2


async def test_a_crash_a_memory_hog_and_deep_recursion_are_over_budget(pool: WorkPool) -> None:
    with pytest.raises(BudgetExceeded) as crashed:
        await pool.run(work_jobs.die)
    assert crashed.value.reason == "crashed"
    with pytest.raises(BudgetExceeded) as hog:
        await pool.run(work_jobs.allocate, 2048)
    assert hog.value.reason == "memory"
    with pytest.raises(BudgetExceeded) as deep:
        await pool.run(work_jobs.recurse)
    assert deep.value.reason == "recursion"
    assert await pool.run(work_jobs.square, 4) == 16


async def test_an_exception_crosses_as_its_type_only(pool: WorkPool) -> None:
    with pytest.raises(WorkFailed) as failed:
        await pool.run(work_jobs.raise_with_secret)
    assert failed.value.kind == "ValueError"
    assert "jane" not in str(failed.value)
    assert await pool.run(work_jobs.square, 5) == 25  # the child stays in service


async def test_a_cancelled_caller_does_not_leave_its_child_computing(pool: WorkPool) -> None:
    pids = await _children(pool)
    task = asyncio.create_task(pool.run(work_jobs.spin, 30.0))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    killed = await asyncio.gather(*(_wait_dead(pid, 1.0) for pid in pids))
    assert sum(killed) == 1  # the one that was computing
    assert await pool.run(work_jobs.square, 6) == 36


async def test_close_stops_every_child_and_refuses_new_calls() -> None:
    pool = WorkPool(processes=2, time_limit=5.0)
    await pool.start()
    pids = await _children(pool)
    busy = asyncio.create_task(pool.run(work_jobs.spin, 30.0))
    await asyncio.sleep(0.2)
    await pool.close()
    with pytest.raises((BudgetExceeded, asyncio.CancelledError, WorkPoolUnavailable)):
        await busy
    for pid in pids:
        assert await _wait_dead(pid)
    with pytest.raises(WorkPoolUnavailable):
        await pool.run(work_jobs.square, 2)


async def test_callers_waiting_for_a_child_are_told_when_the_pool_closes() -> None:
    pool = WorkPool(processes=1, time_limit=5.0)
    await pool.start()
    busy = asyncio.create_task(pool.run(work_jobs.spin, 30.0))
    await asyncio.sleep(0.2)
    waiting = asyncio.create_task(pool.run(work_jobs.square, 2))  # no free child
    await asyncio.sleep(0.1)
    await pool.close()
    with pytest.raises(WorkPoolUnavailable):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(BudgetExceeded):
        await busy


async def test_in_process_runner_has_the_same_interface() -> None:
    assert await InProcess().run(work_jobs.square, 7) == 49


async def test_the_parent_never_unpickles_what_a_child_writes(
        pool: WorkPool, tmp_path: Path) -> None:
    """The child reads untrusted mail; its answers are data-only JSON (issue 36). A child
    that writes a pickle instead (as one taken over by a message could) is refused as a
    crashed child, nothing in the pickle runs in the parent, and the pool goes on."""
    marker = tmp_path / "unpickled-in-the-parent"
    with pytest.raises(BudgetExceeded) as raised:
        await pool.run(work_jobs.answer_with_a_pickle, str(marker))
    assert raised.value.reason == "crashed"
    assert not marker.exists()
    assert await pool.run(work_jobs.square, 4) == 16


async def test_the_products_own_values_cross_as_data() -> None:
    """Dataclasses, enums, bytes, tuples and sets come back as themselves (the child's
    imports take their time on a loaded machine: a generous limit)."""
    assert models.OpenReview  # the parent knows the classes it gets back
    async with WorkPool(processes=1, time_limit=60.0) as slow:
        back = await slow.run(work_jobs.product_values)
    assert back == work_jobs.product_values()
    assert isinstance(back, dict) and type(back["state"]) is models.ItemState
