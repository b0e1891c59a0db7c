"""A worker process of a test's own: the stack's worker program and environment (its store,
Temporal server, sandbox and codec keys) on a task queue no other worker polls, with the
settings the test needs. The test stops it with SIGTERM or kill -9, for real, and starts the
next one on the same queue, as a rollout or a crash would."""

from __future__ import annotations

import uuid

from temporalio.client import WorkflowHandle

from inboxcrm.schemas.models import InboundEmailInput
from inboxcrm.stack.processes import ManagedProcess, free_port, python
from inboxcrm.stack.stack import WORKER_READY, Stack
from inboxcrm.verify.probe import StackClient
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow


class OwnWorker:
    def __init__(self, stack: Stack, **settings: str) -> None:
        self.stack = stack
        self.task_queue = f"inboxcrm-own-{uuid.uuid4().hex[:6]}"
        self.settings = settings
        self.started: list[ManagedProcess] = []

    def start(self) -> ManagedProcess:
        """A new worker process on the queue; returns once it polls."""
        env = dict(self.stack.env, INBOXCRM_TASK_QUEUE=self.task_queue,
                   INBOXCRM_WORKER_METRICS_ADDRESS=f"127.0.0.1:{free_port()}", **self.settings)
        proc = ManagedProcess(f"own-worker-{self.task_queue}", python("inboxcrm.worker"), env,
                              self.stack.log_dir).start()
        self.started.append(proc)
        proc.wait_ready(proc.log_has(WORKER_READY, since=proc.log_offset))
        return proc

    @property
    def current(self) -> ManagedProcess:
        return self.started[-1]

    async def run_item(self, env: StackClient, event_id: str, workflow_id: str,
                       tenant: str = "acme") -> WorkflowHandle[InboundEmailWorkflow, object]:
        """Start a stored event's workflow on this queue (what the relay does on its own)."""
        client = await env.temporal()
        handle = await client.start_workflow(
            InboundEmailWorkflow.run, InboundEmailInput(event_id=event_id, tenant=tenant),
            id=workflow_id, task_queue=self.task_queue)
        return handle  # type: ignore[return-value]

    def stop_all(self) -> None:
        for proc in self.started:
            proc.kill()
