"""Durable attempt counts for the steps outside the ledger (extraction, planning).

A local activity's attempt count lives in the workflow task: when a message kills the worker
(out of memory, a native crash), the re-run starts again at attempt 1, forever. Here each
attempt is counted in PostgreSQL before it starts and the count is cleared when it ends
(success or an ordinary failure, which its retry policy already bounds). An attempt that
never ended (a crash, or a timeout that cancelled it) stays counted; past CRASH_LOOP_LIMIT
the step fails as permanent `crash_loop`: the item is blocked in the review queue, and a
reviewer's retry starts a fresh count (docs/architecture.md §4)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from temporalio.exceptions import ApplicationError

from inboxcrm.activities.failures import refuse_if_worker_draining
from inboxcrm.schemas.models import ItemRef
from inboxcrm.schemas.outcomes import ErrorType
from inboxcrm.store import step_attempts

CRASH_LOOP_LIMIT = 5


class StepAttempt:
    """A step that counts its attempt in its own statements (`begin_step_cte`,
    `end_step_cte`) tells the counter so: `begun(started)` after its first statement,
    `cleared()` after the statement that cleared the count."""

    def __init__(self) -> None:
        self.counted = False
        self.is_cleared = False

    def begun(self, started: int) -> None:
        self.counted = True
        _check(started)

    def cleared(self) -> None:
        self.is_cleared = True


def _check(started: int) -> None:
    if started > CRASH_LOOP_LIMIT:  # cleared on the way out: a reviewer's retry, fresh count
        raise ApplicationError("permanent: crash_loop", type=ErrorType.PERMANENT.value,
                               non_retryable=True)


@asynccontextmanager
async def counted_attempt(pool: asyncpg.Pool, item: ItemRef, step: str,
                          counts_itself: bool = False) -> AsyncIterator[StepAttempt]:
    """Count the attempt before the step's work and clear the count after it. With
    `counts_itself` the step's own first and last statements do both (see StepAttempt): two
    round trips fewer per step; whatever it did not do is done here."""
    refuse_if_worker_draining(step)
    attempt = StepAttempt()
    try:
        if not counts_itself:
            attempt.begun(await step_attempts.begin_step(pool, item.workflow_id, step))
        yield attempt
    except asyncio.CancelledError:
        raise  # cut off (a timeout, a shutdown): counted, like a crash
    except BaseException:
        await step_attempts.end_step(pool, item.workflow_id, step)
        raise
    if not attempt.is_cleared:
        await step_attempts.end_step(pool, item.workflow_id, step)
