"""Durable for days (docs/architecture.md §6): a pause of any length keeps the item running
with a bounded history (continue-as-new), and `inboxcrm resume` wakes it with a signal.
Thirty days pass in the SDK's time-skipping test server; the activities are the real ones,
against the test stack's PostgreSQL and sandbox (counted on the destination side)."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

import asyncpg
import httpx
import pytest
from temporalio.client import WorkflowExecutionStatus

from inboxcrm.platform.config import Settings
from inboxcrm.schemas.contract import SIGNAL_WAKE
from inboxcrm.schemas.models import InboundEmailInput
from inboxcrm.stack import postgres
from inboxcrm.stack.stack import Stack
from inboxcrm.store import items
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow
from tests.helpers.cli import cli
from tests.helpers.stack import worker_data_dir
from tests.helpers.time_skipping import skipping_worker, stored_event

# Longer than every step's retry budget against a refused connection (bookkeeping ~15 s,
# extraction ~15 s, CRM and send ~31 s, planning ~71 s: inboxcrm/workflows/step_options.py).
OUTAGE_SECONDS = 90


async def _switch(pool: asyncpg.Pool, paused: bool) -> None:
    async with pool.acquire() as conn:
        await items.set_pause(conn, "acme", "all", paused, "test")


async def _parked(pool: asyncpg.Pool, event_id: str) -> None:
    for _ in range(300):
        row = await pool.fetchrow("SELECT state, reason FROM inbound_events "
                                  "WHERE event_id = $1::uuid", event_id)
        if row is not None and (row["state"], row["reason"]) == ("crm_pending", "paused"):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the item never parked")


async def test_a_30_day_pause_keeps_the_item_running_and_resume_sends_once(
        env: StackClient, db: asyncpg.Pool, app_settings: Settings) -> None:
    email = unique_email("longpause")
    event_id, workflow_id = await stored_event(db, message_from(email))
    await _switch(db, True)
    try:
        async with skipping_worker(db, app_settings) as skip:
            handle = await skip.client.start_workflow(
                InboundEmailWorkflow.run, InboundEmailInput(event_id, "acme"), id=workflow_id,
                task_queue=skip.task_queue)
            await _parked(db, event_id)

            # A day per call: one call skipping all 30 outran the test server's RPC timeout
            # on a loaded machine (CI, 2 cores: "Timeout expired"); the 30 days are the same.
            for _ in range(30):
                await skip.env.sleep(timedelta(days=1))

            current = skip.client.get_workflow_handle_for(InboundEmailWorkflow.run, workflow_id)
            description = await current.describe()
            assert description.status == WorkflowExecutionStatus.RUNNING
            assert description.run_id != handle.first_execution_run_id  # continued as new
            events = [e async for e in current.fetch_history_events()]
            assert len(events) < 2_000
            assert await env.crm_records_for(email) == []

            await _switch(db, False)
            # What `inboxcrm resume` sends (the test server cannot list workflows; the search
            # that finds parked items is tested on the dev server below).
            await current.signal(SIGNAL_WAKE)
            result = await asyncio.wait_for(
                current.result(), timeout=120)
    finally:
        await _switch(db, False)

    assert (result.state, result.reason) == ("completed", "followup_sent")
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1


async def test_resume_wakes_parked_items_at_once(
        env: StackClient, db: asyncpg.Pool, stack: Stack) -> None:
    """Parked long enough that its next check is 20 s away, the item still finishes within
    seconds of `inboxcrm resume`: the CLI found it by search attribute and signalled it."""
    email = unique_email("woken")
    assert cli(stack, "pause", "--tenant", "acme", "--scope", "all").returncode == 0
    try:
        workflow_id = await env.deliver(message_from(email))
        await env.wait_state(workflow_id, "crm_pending")
        await asyncio.sleep(16)  # checks after 5 s and 10 s more; the next one is 20 s away
        assert await env.state(workflow_id) == ("crm_pending", "paused")
    finally:
        resumed = cli(stack, "resume", "--tenant", "acme", "--scope", "all")
    assert resumed.returncode == 0 and "woke" in resumed.stdout, resumed.stderr

    await env.wait_state(workflow_id, "completed", timeout=10)
    assert len(await env.crm_records_for(email)) == 1
    assert len(await env.emails_to(email)) == 1


@pytest.mark.isolated
async def test_a_store_outage_longer_than_every_retry_budget_needs_no_one(
        env: StackClient, db: asyncpg.Pool, stack: Stack) -> None:
    """PostgreSQL really stopped for longer than any step's retry budget, with items parked
    and one in flight: none fails, none waits for a person; when the store is back every item
    finishes on its own, once. The outage shows on the worker's metrics."""
    if os.environ.get("DATABASE_URL"):
        pytest.skip("needs the embedded PostgreSQL server it can stop")
    data_dir = worker_data_dir("test-pg")
    port = postgres.running_port(data_dir)
    assert port is not None
    emails = [unique_email("outage") for _ in range(3)]
    assert cli(stack, "pause", "--tenant", "acme", "--scope", "send").returncode == 0
    try:
        parked = [await env.deliver(message_from(email)) for email in emails[:2]]
        for workflow_id in parked:
            await env.wait_state(workflow_id, "send_pending")
        in_flight = await env.deliver(message_from(emails[2]))
        postgres.stop(data_dir)
        try:
            await asyncio.sleep(OUTAGE_SECONDS)
        finally:
            postgres.start(data_dir, port)
    finally:
        assert cli(stack, "resume", "--tenant", "acme", "--scope", "send").returncode == 0

    client = await env.temporal()
    for workflow_id in [*parked, in_flight]:
        result = await asyncio.wait_for(client.get_workflow_handle_for(
            InboundEmailWorkflow.run, workflow_id).result(), timeout=300)
        assert (result.state, result.reason) == ("completed", "followup_sent")
    for email in emails:
        assert len(await env.crm_records_for(email)) == 1
        assert len(await env.emails_to(email)) == 1
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(stack.stack_env()["WORKER_METRICS_URL"])).text
    assert "inboxcrm_store_waits" in metrics
