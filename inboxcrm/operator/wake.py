"""Waking items parked on a pause: `inboxcrm resume` lifts the switch, then signals every
running item that may be parked on it, found by search attribute (state and tenant).

The signal only says "check again now"; an item that is not parked ignores it, and one this
listing misses (visibility lags a little) sees the lifted switch on its own fallback timer
(at most an hour later, inboxcrm/workflows/step_options.py)."""

from __future__ import annotations

import asyncio
import re

from temporalio.client import Client

from inboxcrm.schemas.contract import SA_STATE, SA_TENANT, SIGNAL_WAKE, WORKFLOW_TYPE

# The item states in which a step of each pause scope parks.
PARKED_STATES = {"crm": ("crm_pending",), "send": ("send_pending",),
                 "all": ("crm_pending", "send_pending")}
_TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_CONCURRENCY = 20


def parked_query(tenant: str | None, scope: str) -> str:
    """The visibility query of items that may be parked on `scope` for `tenant` (all
    tenants when None)."""
    states = ", ".join(f"'{state}'" for state in PARKED_STATES[scope])
    query = (f"WorkflowType = '{WORKFLOW_TYPE}' AND ExecutionStatus = 'Running' "
             f"AND {SA_STATE.name} IN ({states})")
    if tenant is not None:
        if not _TENANT.match(tenant):
            raise ValueError("tenant names are letters, digits, '.', '_' and '-'")
        query += f" AND {SA_TENANT.name} = '{tenant}'"
    return query


async def wake_parked(client: Client, tenant: str | None, scope: str) -> int:
    """Signal every item that may be parked; returns how many were signalled."""
    gate = asyncio.Semaphore(_CONCURRENCY)

    async def wake(workflow_id: str) -> None:
        async with gate:
            await client.get_workflow_handle(workflow_id).signal(SIGNAL_WAKE)

    ids = [execution.id async for execution in client.list_workflows(
        parked_query(tenant, scope))]
    await asyncio.gather(*(wake(workflow_id) for workflow_id in ids))
    return len(ids)
