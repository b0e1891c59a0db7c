"""Worker process for the engine floor (bench/floor_workflow.py), run by the benchmark as a
separate process beside the product's worker, on its own task queue.

The same worker settings as inboxcrm.worker, through the same function
(`inboxcrm.worker.worker_options`: concurrency limits, local-activity slots included, workflow
cache size, workflow runner, shutdown grace) and the same kind of client runtime (a Prometheus
exporter when `--metrics-address` is given), so that the product/floor ratio compares work, not
configuration. What the floor leaves out is the product's work: no payload codec, no
database, no HTTP, no search attributes, no activity interceptor.

    python -m bench.floor_worker --task-queue bench-floor [--metrics-address 127.0.0.1:9470]
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import uvloop
from temporalio.client import Client
from temporalio.worker import Worker

from bench.floor_workflow import ACTIVITIES, FloorWorkflow
from inboxcrm.platform import temporal
from inboxcrm.platform.config import Settings
from inboxcrm.worker import worker_options

READY = "floor worker running on task queue"


async def run(task_queue: str, metrics_address: str | None) -> None:
    settings = Settings()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    client = await Client.connect(settings.temporal_address,
                                  namespace=settings.temporal_namespace,
                                  runtime=temporal.metrics_runtime(metrics_address))
    options = worker_options(settings)
    worker = Worker(client, task_queue=task_queue, workflows=[FloorWorkflow],
                    activities=ACTIVITIES, **options)
    async with worker:
        shown = {k: type(v).__name__ if k == "workflow_runner" else v
                 for k, v in options.items()}
        print(f"{READY} {task_queue} ({shown})", flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--metrics-address", help="Prometheus exporter, as the product's "
                        "worker has one (default: none)")
    args = parser.parse_args()
    uvloop.run(run(args.task_queue, args.metrics_address))  # same event loop as the worker


if __name__ == "__main__":
    main()
