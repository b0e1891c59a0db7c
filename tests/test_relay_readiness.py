"""A relay that starts during a Temporal outage (a rollout, a rescheduled pod) is ready and
stays ready: its gating probes, as the manifests and the Compose healthcheck ask them, need
PostgreSQL only, because the relay is built to keep storing deliveries while Temporal is down
(`ingress/intake.py` `TemporalHandle`; the sweeper starts them later). With a probe on
Temporal, Kubernetes restarts such a relay in a loop (startupProbe) and takes every relay out
of the Service (readinessProbe), so providers meet the ingress's errors instead of a stored
delivery. A stack of the test's own: its Temporal dev server is the one stopped."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from inboxcrm.schemas.models import inbound_workflow_id
from inboxcrm.stack.processes import ManagedProcess, python
from inboxcrm.stack.stack import Stack, isolated_config
from inboxcrm.store import db as inboxcrm_db
from inboxcrm.verify.probe import Endpoints, StackClient, message_from, unique_email
from tests.helpers.stack import ROOT


def gating_probe_paths() -> set[str]:
    """The paths of the relay's startup and readiness probes (deploy/k8s/base/relay.yaml)."""
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/k8s/base/relay.yaml").read_text())
            if d]
    [relay] = [d for d in docs if d["kind"] == "Deployment"]
    container = relay["spec"]["template"]["spec"]["containers"][0]
    return {container[probe]["httpGet"]["path"] for probe in ("startupProbe", "readinessProbe")}


@pytest.fixture
def outage_stack(database_url: str, tmp_path: Path) -> Iterator[Stack]:
    """PostgreSQL (the shared test server), a Temporal dev server and a sandbox of its own;
    no relay and no worker yet."""
    stack = Stack(isolated_config(tmp_path / "stack", database_url,
                                  queue_prefix="inboxcrm-readiness"))
    try:
        stack.start_infrastructure()
        yield stack
    finally:
        stack.stop()


async def test_a_relay_started_while_temporal_is_down_is_ready_and_stores(
        outage_stack: Stack, database_url: str) -> None:
    stack = outage_stack
    stack.processes["temporal"].stop()  # the outage, before the relay starts
    relay = ManagedProcess("relay", python("inboxcrm.ingress.main"), dict(stack.env),
                           stack.log_dir).start()
    stack.processes["relay"] = relay
    paths = gating_probe_paths()

    def probes_pass() -> bool:
        return all(httpx.get(f"{stack.relay_url}{path}", timeout=5).status_code == 200
                   for path in paths)

    # The startupProbe's budget in the manifest: failureThreshold x periodSeconds (120 s).
    relay.wait_ready(probes_pass, timeout=120)
    compose_check = [sys.executable, "deploy/healthcheck.py", "relay"]
    pool = await inboxcrm_db.create_pool(database_url, max_size=2)
    client = StackClient(Endpoints(stack.relay_url, stack.sandbox_url, stack.temporal_address,
                                   stack.env["INBOXCRM_WEBHOOK_SECRET"]), pool)
    try:
        for _ in range(3):  # and it stays ready while the outage lasts
            await asyncio.sleep(3)
            assert probes_pass(), f"{paths} failed during the outage; see {relay.log_path}"
            check = await asyncio.create_subprocess_exec(
                *compose_check, cwd=ROOT, env={**os.environ, **stack.env})
            assert await asyncio.wait_for(check.wait(), 30) == 0, \
                "Compose's relay healthcheck fails"
        # GET /healthz keeps reporting Temporal (DESIGN.md section 10): not a gate.
        health = await client.http.get(f"{stack.relay_url}/healthz")
        assert (health.status_code, health.json()) == (
            503, {"ok": False, "database": True, "temporal": False})
        # What readiness promises: a delivery is stored (503: the provider redelivers).
        delivery_id = f"D-outage-{os.getpid()}"
        response = await client.post(message_from(unique_email("outage")), delivery_id)
        assert response.status_code == 503 and "stored" in response.text, response.text
        workflow_id = inbound_workflow_id("acme", "standard", "sales@acme.test", delivery_id)
        state, _ = await client.state(workflow_id)
        assert state is not None, "the delivery was not stored"
    finally:
        await client.aclose()
        await pool.close()
