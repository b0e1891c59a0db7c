"""Heartbeats for the whole of an activity attempt, so a crashed worker is noticed within
the heartbeat timeout (seconds) instead of the start-to-close timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

INTERVAL_SECONDS = 2.0


@contextlib.asynccontextmanager
async def heartbeating(interval: float = INTERVAL_SECONDS) -> AsyncIterator[None]:
    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(interval)

    if activity.info().is_local:
        # Local activities cannot heartbeat: the workflow task timeout covers a dead worker.
        yield
        return
    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
