"""The local stack as `inboxcrm up` runs it: a port in use is one clear line, not a
traceback; several worker processes share the one task queue."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from inboxcrm.stack.processes import free_port
from inboxcrm.stack.stack import Stack, isolated_config, worker_count


def test_port_in_use_is_a_clear_message(database_url: str, tmp_path: object) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = dict(os.environ, DATABASE_URL=database_url,
                   INBOXCRM_TEMPORAL_PORT=str(port),
                   INBOXCRM_TEMPORAL_UI_PORT=str(free_port()),
                   INBOXCRM_RELAY_PORT=str(free_port()),
                   INBOXCRM_SANDBOX_PORT=str(free_port()))
        env.pop("TEMPORAL_ADDRESS", None)
        result = subprocess.run([sys.executable, "-m", "inboxcrm.cli", "up"], env=env,
                                capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert f"port {port}" in result.stderr and "INBOXCRM_TEMPORAL_PORT" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_two_workers_both_poll_the_task_queue(stack: Stack, database_url: str,
                                              tmp_path: Path) -> None:
    """INBOXCRM_WORKERS=2: two worker processes, each a poller of the one task queue (as
    Temporal sees them) with a metrics endpoint of its own."""
    config = isolated_config(tmp_path, database_url, queue_prefix="inboxcrm-workers",
                             temporal_address=stack.temporal_address)
    config.workers = worker_count({"INBOXCRM_WORKERS": "2"}, cpus=1)
    pair = Stack(config)
    try:
        pair.start_infrastructure()
        workers = pair.start_workers()
        assert [proc.name for proc in workers] == ["worker", "worker-2"]
        assert all(proc.alive() for proc in workers)
        pids = {str(proc.pid) for proc in workers}
        assert len(pids) == 2
        assert asyncio.run(poller_pids(pair, pids)) == pids
        for index in (1, 2):
            url = f"http://{pair.worker_metrics_address(index)}/metrics"
            assert "temporal_" in httpx.get(url, timeout=5).text
    finally:
        pair.stop()


async def poller_pids(stack: Stack, expected: set[str], timeout: float = 30.0) -> set[str]:
    """The process IDs among the workflow-task pollers of the stack's queue (the SDK's
    default identity is `pid@host`), once all of `expected` have polled or time is up."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    from inboxcrm.platform.temporal import connect

    client = await connect(stack.settings())
    deadline = time.monotonic() + timeout
    seen: set[str] = set()
    while time.monotonic() < deadline and not expected <= seen:
        answer = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=stack.config.task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
        seen = {poller.identity.split("@", 1)[0] for poller in answer.pollers}
        await asyncio.sleep(0.5)
    return seen
