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


def test_a_further_worker_started_from_stack_env_alone_sends_the_follow_up(
        stack: Stack, database_url: str, tmp_path: Path) -> None:
    """An operator adds a worker to a running `make up` with `.data/stack.env` and nothing
    else; it is the only worker of its stack here, so the follow-up is its work. Round
    three's file lacked the unsubscribe secret: that worker refused every follow-up."""
    from inboxcrm.verify.probe import unique_email

    config = isolated_config(tmp_path, database_url, queue_prefix="inboxcrm-further",
                             temporal_address=stack.temporal_address)
    own = Stack(config)
    further: subprocess.Popen[bytes] | None = None
    try:
        own.start_infrastructure()
        env_file = own.write_stack_env()
        values = stack_env_values(env_file)
        assert values["INBOXCRM_UNSUBSCRIBE_SECRET"] == own.env["INBOXCRM_UNSUBSCRIBE_SECRET"]
        bare = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
        with open(tmp_path / "further-worker.log", "wb") as log:
            further = subprocess.Popen([sys.executable, "-m", "inboxcrm.worker"],
                                       env={**bare, **values}, stdout=log,
                                       stderr=subprocess.STDOUT)
        own.start_relay()
        email = unique_email("further")
        cli_env = {**bare, "INBOXCRM_STACK_ENV": str(env_file)}
        sent = subprocess.run([sys.executable, "-m", "inboxcrm.cli", "send-test", "--from",
                               f"Fur Ther <{email}>"], env=cli_env, capture_output=True,
                              text=True, timeout=60, check=True)
        workflow_id = sent.stdout.split('"workflow_id": "', 1)[1].split('"', 1)[0]
        state = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and state != "completed":
            answer = subprocess.run([sys.executable, "-m", "inboxcrm.cli", "status",
                                     workflow_id], env=cli_env, capture_output=True,
                                    text=True, timeout=60, check=False)
            state = answer.stdout.split('"state": "', 1)[-1].split('"', 1)[0]
            time.sleep(0.5)
        assert state == "completed", (tmp_path / "further-worker.log").read_text()[-2000:]
        emails = httpx.get(f"{own.sandbox_url}/_sandbox/state", timeout=10).json()["emails"]
        assert [e["to"] for e in emails if email in e["to"]] == [[email]]
    finally:
        if further is not None:
            further.terminate()
            further.wait(30)
        own.stop()


def stack_env_values(path: Path) -> dict[str, str]:
    """`.data/stack.env` as a shell would read it (`set -a; . .data/stack.env`)."""
    import shlex

    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            values[key] = shlex.split(value)[0] if value else ""
    return values
