"""Temporal's task-queue fairness on its own, without the product (`python -m
bench.fairness_probe`, bench/README.md section 6): the dev server the stack runs, with the
stack's flags; trivial workflows whose only work is four sleeping local activities (no CPU
to share); tenant A starts a burst from `--lanes` concurrent starts while tenant B starts
one workflow every `--b-every` seconds. Prints, for each of B's workflows, when it started
(seconds after A's first start) and how long its first workflow task waited at the server
(`WorkflowExecutionStarted` -> `WorkflowTaskStarted`), with fairness keys and without.

It separates what the server does from what the product's workers do: the noisy-neighbour
benchmark's `queued` phase under a burst is the server's, this probe shows how much of it
the server alone produces. Figures, never pass/fail.

    python -m bench.fairness_probe [--burst 600] [--slots 2] [--step-ms 300] [--no-fair]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/fairness_probe.py`
    sys.path.insert(0, str(ROOT))

from temporalio import activity, workflow  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.common import Priority  # noqa: E402
from temporalio.worker import UnsandboxedWorkflowRunner, Worker  # noqa: E402

from bench.common import summary_ms  # noqa: E402
from inboxcrm.stack.processes import free_port, temporal_dev_server_argv  # noqa: E402


@activity.defn
async def probe_step(milliseconds: int) -> None:
    await asyncio.sleep(milliseconds / 1000)


@workflow.defn
class ProbeItem:
    """Four steps as local activities in one workflow task, as an inbound item's are."""

    @workflow.run
    async def run(self, item_ms: int) -> None:
        for _ in range(4):
            await workflow.execute_local_activity(
                probe_step, item_ms // 4, start_to_close_timeout=timedelta(seconds=30))


async def first_task_wait(client: Client, workflow_id: str) -> tuple[float, float]:
    """(started at, seconds its first workflow task waited) from the history."""
    started = first = None
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        at = event.event_time.ToDatetime().timestamp()
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            started = at
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            first = at
            break
    assert started is not None and first is not None, workflow_id
    return started, first - started


async def probe(address: str, args: argparse.Namespace, fair: bool) -> dict[str, Any]:
    clients = [await Client.connect(address) for _ in range(args.workers)]
    queue = f"fairness-probe-{uuid.uuid4().hex[:6]}"
    workers = [Worker(c, task_queue=queue, workflows=[ProbeItem], activities=[probe_step],
                      max_concurrent_workflow_tasks=args.slots,
                      workflow_runner=UnsandboxedWorkflowRunner()) for c in clients]
    client = clients[0]

    def priority(tenant: str) -> Priority | None:
        return Priority(fairness_key=tenant, fairness_weight=1.0) if fair else None

    lanes = asyncio.Semaphore(args.lanes)

    async def start(workflow_id: str, tenant: str) -> None:
        async with lanes if tenant == "a" else contextlib.nullcontext():
            await client.start_workflow(ProbeItem.run, args.step_ms, id=workflow_id,
                                        task_queue=queue, priority=priority(tenant))

    async with contextlib.AsyncExitStack() as running:
        for each in workers:
            await running.enter_async_context(each)
        a_ids = [f"{queue}-a-{i}" for i in range(args.burst)]
        t0 = time.time()
        async def a_burst() -> float:
            await asyncio.gather(*(start(i, "a") for i in a_ids))
            return time.time() - t0

        a_starts = asyncio.ensure_future(a_burst())
        b_ids: list[str] = []
        for i in range(args.b_count):
            b_ids.append(f"{queue}-b-{i}")
            await start(b_ids[-1], "b")
            await asyncio.sleep(args.b_every)
        a_started_in = await a_starts
        for workflow_id in b_ids + a_ids:
            await client.get_workflow_handle(workflow_id).result()
        waits = [await first_task_wait(client, w) for w in b_ids]
    during = [w for at, w in waits if at - t0 <= a_started_in]
    after = [w for at, w in waits if at - t0 > a_started_in]
    return {"fair": fair, "a_started_in_seconds": round(a_started_in, 1),
            "b_first_task_wait_ms": {"while_a_starts": summary_ms(during),
                                     "after": summary_ms(after)},
            "b_timeline": [(round(at - t0, 1), round(w * 1000)) for at, w in waits]}


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        *temporal_dev_server_argv(port, None, None),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        address = f"127.0.0.1:{port}"
        for _ in range(300):
            try:
                await Client.connect(address)
                break
            except RuntimeError:
                await asyncio.sleep(0.1)
        modes = [True, False] if args.both else [not args.no_fair]
        return [await probe(address, args, fair) for fair in modes]
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=600, help="A's workflows (default 600)")
    parser.add_argument("--lanes", type=int, default=50, help="A's concurrent starts")
    parser.add_argument("--b-count", type=int, default=40, help="B's workflows")
    parser.add_argument("--b-every", type=float, default=0.5, help="seconds between B's")
    parser.add_argument("--slots", type=int, default=2, help="workflow task slots per worker")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=int, default=300,
                        help="the item's sleeping time, over its four steps")
    parser.add_argument("--no-fair", action="store_true", help="no fairness keys")
    parser.add_argument("--both", action="store_true", help="with fairness keys, then without")
    args = parser.parse_args(argv)
    for result in asyncio.run(main_async(args)):
        print(json.dumps({k: v for k, v in result.items() if k != "b_timeline"}))
        print("  B (started s, first task waited ms):", result["b_timeline"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
