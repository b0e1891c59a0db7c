"""Two tenants in two Temporal namespaces side by side (issue 36; docs/architecture.md §7,
Namespaces): a stack of the test's own, started as `make up` starts one with
INBOXCRM_TENANT_NAMESPACES set (its dev server creates the namespaces, the worker polls each),
one item of acme and two of globex through the real relay and worker, and then what the
Temporal UI of each namespace lists: its own tenant's workflows, none of the other's. A
globex item's follow-up approval is decided by the operator's CLI (straight to Temporal) and
one through the relay's `/v1/decisions` (what a reviewer's CLI sends): both find the item in
globex's namespace."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client

from inboxcrm.platform import temporal
from inboxcrm.schemas.contract import WORKFLOW_TYPE
from inboxcrm.stack.stack import Stack, isolated_config
from inboxcrm.store import db as inboxcrm_db
from inboxcrm.verify.probe import Endpoints, StackClient, message_from, unique_email
from tests.helpers.cli import cli
from tests.helpers.messages import GLOBEX, to_globex
from tests.helpers.stack import TEST_GLOBEX_WEBHOOK_SECRET, TEST_WEBHOOK_SECRET

NAMESPACES = {"acme": "inboxcrm-acme", "globex": "inboxcrm-globex"}


@pytest.fixture
def ns_stack(database_url: str, tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(isolated_config(
        tmp_path / "stack", database_url, queue_prefix="inboxcrm-ns",
        extra_env={"INBOXCRM_WEBHOOK_SECRET": TEST_WEBHOOK_SECRET,
                   "INBOXCRM_WEBHOOK_SECRET_GLOBEX": TEST_GLOBEX_WEBHOOK_SECRET,
                   "INBOXCRM_TENANT_NAMESPACES": ",".join(
                       f"{tenant}={namespace}" for tenant, namespace in NAMESPACES.items())}))
    try:
        stack.start_all()
        yield stack
    finally:
        stack.stop()


@pytest.fixture
async def ns_env(ns_stack: Stack, database_url: str) -> AsyncIterator[StackClient]:
    stack = ns_stack
    pool = await inboxcrm_db.create_pool(database_url, max_size=3)
    env = StackClient(Endpoints(stack.relay_url, stack.sandbox_url, stack.temporal_address,
                                stack.env["INBOXCRM_WEBHOOK_SECRET"],
                                {"globex": stack.env["INBOXCRM_WEBHOOK_SECRET_GLOBEX"]}),
                      pool, stack.settings())
    try:
        yield env
    finally:
        await env.aclose()
        await pool.close()


async def listed(client: Client, task_queue: str) -> set[str]:
    """What the namespace's UI lists of this stack's items."""
    query = f"WorkflowType = '{WORKFLOW_TYPE}' AND TaskQueue = '{task_queue}'"
    return {execution.id async for execution in client.list_workflows(query)}


async def test_two_tenants_in_two_namespaces_see_only_their_own(
        ns_stack: Stack, ns_env: StackClient) -> None:
    stack, env = ns_stack, ns_env
    settings = stack.settings()
    assert [temporal.namespace_for(settings, t) for t in NAMESPACES] == list(NAMESPACES.values())

    acme_item = await env.deliver(message_from(unique_email("ns-acme")))
    by_operator = await env.deliver(to_globex(message_from(unique_email("ns-globex"))), **GLOBEX)
    by_reviewer = await env.deliver(to_globex(message_from(unique_email("ns-globex"))), **GLOBEX)
    await env.wait_state(acme_item, "completed")
    # globex: a follow-up to a new prospect waits for a reviewer's approval.
    for item in (by_operator, by_reviewer):
        assert (await env.wait_state(item, "awaiting_review"))[1] == "followup_approval_required"

    # The operator's CLI sends its update straight to Temporal, in globex's namespace.
    approved = cli(stack, "review", "approve", by_operator, "--reviewer", "olga")
    assert approved.returncode == 0, approved.stderr
    # A decision through the relay (`POST /v1/decisions`, what a reviewer's CLI sends):
    # the relay finds the item in globex's namespace too.
    through_relay = await env.http.post(
        f"{stack.relay_url}/v1/decisions",
        json={"workflow_id": by_reviewer, "action": "approve", "reviewer": "olga"},
        headers={"Authorization": f"Bearer {stack.env['INBOXCRM_REVIEW_TOKEN']}"})
    assert through_relay.status_code == 200, through_relay.text
    assert through_relay.json()["accepted"] is True
    for item in (by_operator, by_reviewer):
        await env.wait_state(item, "completed")

    shared = await temporal.connect(settings)
    acme_ns = temporal.in_namespace(shared, NAMESPACES["acme"])
    globex_ns = temporal.in_namespace(shared, NAMESPACES["globex"])
    queue = settings.task_queue
    # Visibility follows the close of a run: wait for each namespace's own items to show.
    await env.wait_for(lambda: _has(acme_ns, queue, {acme_item}), what="acme's items listed")
    await env.wait_for(lambda: _has(globex_ns, queue, {by_operator, by_reviewer}),
                       what="globex's items listed")
    assert await listed(acme_ns, queue) == {acme_item}
    assert await listed(globex_ns, queue) == {by_operator, by_reviewer}
    assert await listed(shared, queue) == set()  # nothing of theirs in the shared namespace
    # The search attributes are registered in each namespace (the UI's queue filters).
    tenant_query = f"WorkflowType = '{WORKFLOW_TYPE}' AND Tenant = 'globex'"
    assert [e.id async for e in acme_ns.list_workflows(tenant_query)] == []

    # The codec endpoint the UI of each namespace is given serves both namespaces and no
    # other (the open local codec: loopback relay, INBOXCRM_ENV=local).
    empty = {"payloads": []}
    for namespace in NAMESPACES.values():
        answer = await env.http.post(f"{stack.relay_url}/codec/decode", json=empty,
                                     headers={"x-namespace": namespace})
        assert answer.status_code == 200, answer.text
    stray = await env.http.post(f"{stack.relay_url}/codec/decode", json=empty,
                                headers={"x-namespace": "inboxcrm-initech"})
    assert stray.status_code == 403

    # A deployment's bootstrap registers a namespace that does not exist yet (an external
    # cluster), once, with the search attributes in it.
    extra = f"inboxcrm-extra-{uuid.uuid4().hex[:6]}"
    assert await temporal.ensure_namespaces(shared, [extra]) == [extra]
    assert await temporal.ensure_namespaces(shared, [extra, NAMESPACES["acme"]]) == []
    assert await listed(temporal.in_namespace(shared, extra), queue) == set()

    async def retention(namespace: str) -> object:
        described = await shared.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace))
        return described.config.workflow_execution_retention_ttl.ToTimedelta()

    assert await retention(extra) == await retention(shared.namespace)  # the shared one's


async def _has(client: Client, task_queue: str, wanted: set[str]) -> bool:
    return wanted <= await listed(client, task_queue)
