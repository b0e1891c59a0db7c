"""Metrics and logs: what operators watch during an incident, and what must never be in it."""

from __future__ import annotations

import asyncio
import json
import re

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.messages import no_sender_message
from tests.helpers.metrics import sample, scrape, scrape_until


async def test_relay_metrics_count_deliveries_and_show_the_oldest_item_ageing(
    env: StackClient, stack: Stack,
) -> None:
    metrics_url = stack.relay_metrics_url
    await env.post(message_from(unique_email("forged")), secret="whsec_" + "QUJD" * 8)
    workflow_id = await env.deliver(no_sender_message())
    await env.wait_state(workflow_id, "awaiting_review")

    first = await scrape_until(env, metrics_url, lambda text: (sample(
        text, "inboxcrm_items", '{state="awaiting_review"}') or 0) >= 1)
    await asyncio.sleep(2.5)
    second = await scrape(env, metrics_url)

    assert (sample(first, "inboxcrm_signature_failures_total", '{source="standard"}') or 0) >= 1
    assert (sample(first, "inboxcrm_deliveries_received_total",
                   '{outcome="accepted",source="standard"}') or 0) >= 1
    assert sample(first, "inboxcrm_items", '{state="awaiting_review"}') is not None
    older = sample(second, "inboxcrm_review_oldest_age_seconds")
    younger = sample(first, "inboxcrm_review_oldest_age_seconds")
    assert older is not None and younger is not None and older >= younger + 2
    assert (sample(second, "inboxcrm_review_queue_size") or 0) >= 1
    assert sample(second, "inboxcrm_duplicate_provider_message_ids") == 0
    await env.signal(workflow_id, "reject", {"reviewer": "ops"})
    await env.wait_state(workflow_id, "rejected")


async def test_worker_exports_sdk_and_app_metrics(env: StackClient, stack: Stack) -> None:
    workflow_id = await env.deliver(message_from(unique_email("metered")))
    await env.wait_state(workflow_id, "completed")
    text = await scrape(env, f"http://{stack.env['INBOXCRM_WORKER_METRICS_ADDRESS']}/metrics")
    assert "temporal_activity_execution_latency" in text or "temporal_request" in text
    assert re.search(r'^inboxcrm_operations_completed\S*\{.*action="send"', text, re.M)


async def test_logs_are_json_with_references_and_never_personal_data(
    env: StackClient, stack: Stack,
) -> None:
    email = unique_email("private")
    name = "Privata Person"
    workflow_id = await env.deliver(message_from(email, name=name, body="Secret body text 42"))
    await env.wait_state(workflow_id, "completed")

    worker_lines = [json.loads(line) for line in
                    (stack.log_dir / "worker.log").read_text().splitlines()
                    if line.startswith("{")]
    attempts = [e for e in worker_lines if e.get("op_key", "").startswith(workflow_id)]
    assert attempts and all(e["workflow_id"] == workflow_id for e in attempts)
    for log in stack.log_dir.glob("*.log"):
        text = log.read_text(errors="replace")
        for secret in (email, name, "Secret body text 42"):
            assert secret not in text, f"{secret!r} leaked into {log.name}"


async def test_every_source_feeds_the_signature_failure_metric(
    env: StackClient, stack: Stack,
) -> None:
    await env.http.post(f"{stack.relay_url}/v1/inbound/postmark", json={},
                        auth=("wrong", "credentials"))
    await env.http.post(f"{stack.relay_url}/v1/inbound/mailgun",
                        data={"timestamp": "1", "token": "t", "signature": "bad"})
    text = await scrape(env, stack.relay_metrics_url)
    for source in ("postmark", "mailgun"):
        count = sample(text, "inboxcrm_signature_failures_total", f'{{source="{source}"}}')
        assert (count or 0) >= 1, source
