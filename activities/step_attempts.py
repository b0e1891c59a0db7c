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

from activities.failures import refuse_if_worker_draining
from inboxcrm.store import step_attempts
from schemas.models import ItemRef
from schemas.outcomes import ErrorType

CRASH_LOOP_LIMIT = 5


@asynccontextmanager
async def counted_attempt(pool: asyncpg.Pool, item: ItemRef, step: str) -> AsyncIterator[None]:
    refuse_if_worker_draining(step)
    started = await step_attempts.begin_step(pool, item.workflow_id, step)
    if started > CRASH_LOOP_LIMIT:
        # A reviewer's retry: a fresh count.
        await step_attempts.end_step(pool, item.workflow_id, step)
        raise ApplicationError("permanent: crash_loop", type=ErrorType.PERMANENT.value,
                               non_retryable=True)
    try:
        yield
    except asyncio.CancelledError:
        raise  # cut off (a timeout, a shutdown): counted, like a crash
    except BaseException:
        await step_attempts.end_step(pool, item.workflow_id, step)
        raise
    await step_attempts.end_step(pool, item.workflow_id, step)
