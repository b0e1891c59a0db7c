"""Durable for days (docs/architecture.md §6): a pause of any length keeps the item running
with a bounded history (continue-as-new), and `inboxcrm resume` wakes it with a signal.
Thirty days pass in the SDK's time-skipping test server; the activities are the real ones,
against the test stack's PostgreSQL and sandbox (counted on the destination side)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
from temporalio.client import WorkflowExecutionStatus

from inboxcrm.platform.config import Settings
from inboxcrm.stack.stack import Stack
from inboxcrm.store import items as operator
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from schemas.contract import SIGNAL_WAKE
from schemas.models import InboundEmailInput
from tests.helpers.cli import cli
from tests.helpers.time_skipping import skipping_worker, stored_event
from workflows.inbound_email import InboundEmailWorkflow


async def _switch(pool: asyncpg.Pool, paused: bool) -> None:
    async with pool.acquire() as conn:
        await operator.set_pause(conn, "acme", "all", paused, "test")


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

            await skip.env.sleep(timedelta(days=30))

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
