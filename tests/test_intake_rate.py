"""A tenant over its relay intake rate (policy `capacity.intake_per_second`) is answered
429 with Retry-After, nothing stored; every redelivery after it is accepted once, and each
person still has one CRM record and one follow-up (docs/capacity.md, issue 38).

A relay and a worker of the test's own read a policy directory where acme's rate is 1 per
second with a burst of 3; the shared stack's relay keeps the repository's policies."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inboxcrm.stack.processes import ManagedProcess, free_port, http_ok, python
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.own_worker import OwnWorker
from tests.helpers.stack import ROOT

pytestmark = pytest.mark.asyncio(loop_scope="session")

RATE, BURST, SENT = 1.0, 3, 8


@pytest.fixture(scope="module")
def limited_policies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("rate-policies") / "policies"
    shutil.copytree(ROOT / "policies", directory)
    acme = json.loads((directory / "acme.json").read_text())
    acme["capacity"] = {"intake_per_second": RATE, "intake_burst": BURST,
                        "fairness_weight": 2.0}
    (directory / "acme.json").write_text(json.dumps(acme), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def worker(stack: Stack, limited_policies: Path) -> Iterator[OwnWorker]:
    own = OwnWorker(stack, INBOXCRM_POLICY_DIR=str(limited_policies))
    own.start()
    yield own
    own.stop_all()


@pytest.fixture(scope="module")
def relay_url(stack: Stack, limited_policies: Path, worker: OwnWorker) -> Iterator[str]:
    port = free_port()
    env = dict(stack.env, INBOXCRM_POLICY_DIR=str(limited_policies),
               INBOXCRM_TASK_QUEUE=worker.task_queue, INBOXCRM_RELAY_PORT=str(port),
               INBOXCRM_RELAY_METRICS_ADDRESS=f"127.0.0.1:{free_port()}")
    relay = ManagedProcess(f"own-relay-{port}", python("inboxcrm.ingress.main"), env,
                           stack.log_dir).start()
    url = f"http://127.0.0.1:{port}"
    try:
        relay.wait_ready(http_ok(f"{url}/healthz"))
        yield url
    finally:
        relay.kill()


async def test_over_its_rate_a_tenant_is_told_to_retry_and_nothing_is_lost(
        env: StackClient, relay_url: str) -> None:
    people = [unique_email("rate") for _ in range(SENT)]
    deliveries = {f"R-{uuid.uuid4().hex[:10]}": email for email in people}

    async def post(delivery_id: str) -> httpx.Response:
        return await env.post(message_from(deliveries[delivery_id]), delivery_id,
                              relay_url=relay_url)

    first = dict(zip(deliveries, await asyncio.gather(*map(post, deliveries)), strict=True))
    limited = [d for d, r in first.items() if r.status_code == 429]
    # The burst is admitted, the rest told to come back: nothing of theirs is stored.
    assert SENT - BURST - 1 <= len(limited) <= SENT - BURST, {
        d: r.status_code for d, r in first.items()}
    for delivery_id in limited:
        assert int(first[delivery_id].headers["Retry-After"]) >= 1
    stored = await env.count("SELECT count(*) FROM inbound_events WHERE delivery_id = ANY($1)",
                             limited)
    assert stored == 0

    # As a provider does: each refused delivery again after its Retry-After, until accepted.
    answers: Counter[str] = Counter(r.json()["status"] for r in first.values()
                                    if r.status_code == 200)
    waiting = {d: int(first[d].headers["Retry-After"]) for d in limited}
    for _ in range(60):
        if not waiting:
            break
        await asyncio.sleep(min(waiting.values()))
        for delivery_id in sorted(waiting):
            response = await post(delivery_id)
            if response.status_code == 429:
                waiting[delivery_id] = int(response.headers["Retry-After"])
                continue
            assert response.status_code == 200, response.text
            answers[response.json()["status"]] += 1
            del waiting[delivery_id]
    assert not waiting
    assert answers == Counter({"accepted": SENT})

    # A redelivery of each, paced under the rate: the same items, nothing new.
    for delivery_id in deliveries:
        response = await post(delivery_id)
        for _ in range(30):
            if response.status_code != 429:
                break
            await asyncio.sleep(int(response.headers["Retry-After"]))
            response = await post(delivery_id)
        assert response.json()["status"] == "duplicate", response.text
    assert await env.count("SELECT count(*) FROM inbound_events WHERE delivery_id = ANY($1)",
                           list(deliveries)) == SENT

    # Every item ran to its end on the worker that reads the same policies: one record and
    # at most one follow-up per person at the destination.
    for delivery_id, email in deliveries.items():
        row = await env.db.fetchrow("SELECT workflow_id FROM inbound_events "
                                    "WHERE delivery_id = $1", delivery_id)
        assert row is not None
        await env.wait_state(row["workflow_id"], "completed", timeout=180)
        assert len(await env.crm_records_for(email)) == 1
        assert len(await env.emails_to(email)) == 1
