"""Worker process for the engine floor (bench/floor_workflow.py), run by the benchmark as a
separate process beside the product's worker, on its own task queue.

Same worker settings as inboxcrm.worker: INBOXCRM_MAX_CONCURRENT_ACTIVITIES and
INBOXCRM_MAX_CONCURRENT_WORKFLOW_TASKS through the same Settings class, the same limit on
local-activity slots (inboxcrm.worker.MAX_CONCURRENT_LOCAL_ACTIVITIES, the product's pool
size), SDK defaults for everything else (pollers, sticky cache).

    python -m bench.floor_worker --task-queue bench-floor
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import uvloop
from temporalio.client import Client
from temporalio.worker import Worker

from bench.floor_workflow import ACTIVITIES, FloorWorkflow
from inboxcrm.platform.config import Settings
from inboxcrm.worker import MAX_CONCURRENT_LOCAL_ACTIVITIES

READY = "floor worker running on task queue"


async def run(task_queue: str) -> None:
    settings = Settings()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    client = await Client.connect(settings.temporal_address,
                                  namespace=settings.temporal_namespace)
    worker = Worker(
        client, task_queue=task_queue, workflows=[FloorWorkflow], activities=ACTIVITIES,
        max_concurrent_activities=settings.max_concurrent_activities,
        max_concurrent_workflow_tasks=settings.max_concurrent_workflow_tasks,
        max_concurrent_local_activities=MAX_CONCURRENT_LOCAL_ACTIVITIES,
    )
    async with worker:
        print(f"{READY} {task_queue} (max_concurrent_activities="
              f"{settings.max_concurrent_activities}, max_concurrent_workflow_tasks="
              f"{settings.max_concurrent_workflow_tasks}, max_concurrent_local_activities="
              f"{MAX_CONCURRENT_LOCAL_ACTIVITIES})", flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task-queue", required=True)
    uvloop.run(run(parser.parse_args().task_queue))  # same event loop as inboxcrm.worker


if __name__ == "__main__":
    main()
