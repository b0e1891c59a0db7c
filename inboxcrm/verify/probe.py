"""A client of a running stack: posts signed deliveries, injects sandbox faults, reads the
destination's records and the store's state. The rehearsal, the chaos driver, the
benchmarks and the tests are all scenarios written on top of it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
from temporalio.client import Client

from inboxcrm.platform import temporal
from inboxcrm.platform.codec import tenant_of_workflow
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.contract import QUERY_STATUS
from inboxcrm.store import contacts, events, ledger
from inboxcrm.store import db as store_db
from inboxcrm.verify.signing import sample_message, signed_headers, standard_body

TERMINAL = {"completed", "ignored", "suppressed", "rejected", "failed", "shadowed"}


def unique_email(prefix: str = "person") -> str:
    return f"{prefix}.{uuid.uuid4().hex[:10]}@example.com"


def message_from(email: str, name: str = "Jane Doe", subject: str = "Pricing for 20 seats",
                 body: str | None = None, extra_headers: str = "") -> str:
    text = body or f"Hi, could you send me pricing for 20 seats?\n\nThanks,\n{name}\nExample Corp\n"
    raw = sample_message(sender=f"{name} <{email}>", subject=subject, body=text)
    if extra_headers:
        raw = extra_headers + raw
    return raw


@dataclass(frozen=True)
class Endpoints:
    relay_url: str
    sandbox_url: str
    temporal_address: str
    webhook_secret: str
    # Tenants with a Standard Webhooks secret of their own (INBOXCRM_WEBHOOK_SECRET_<TENANT>):
    # their deliveries are signed with it, everyone else's with `webhook_secret`.
    tenant_secrets: dict[str, str] = field(default_factory=dict)


class StackClient:
    def __init__(self, endpoints: Endpoints, db: asyncpg.Pool,
                 settings: Settings | None = None) -> None:
        self.endpoints = endpoints
        self.db = db
        self.settings = settings
        self.http = httpx.AsyncClient(timeout=60)
        self.secret = endpoints.webhook_secret
        self._temporal: Client | None = None

    async def aclose(self) -> None:
        await self.http.aclose()

    # --- ingress -------------------------------------------------------------------------
    async def post(self, raw: str, delivery_id: str | None = None, *, tenant: str = "acme",
                   mailbox: str = "sales@acme.test", secret: str | None = None,
                   timestamp: float | None = None, body: bytes | None = None,
                   headers: dict[str, str] | None = None,
                   relay_url: str | None = None) -> httpx.Response:
        delivery_id = delivery_id or f"D-{uuid.uuid4().hex[:12]}"
        payload = body if body is not None else standard_body(tenant, mailbox, delivery_id, raw)
        secret = secret or self.endpoints.tenant_secrets.get(tenant) or self.secret
        sig = signed_headers(secret, payload, timestamp=timestamp)
        sig.update(headers or {})
        relay = relay_url or self.endpoints.relay_url
        return await self.http.post(f"{relay}/v1/inbound/standard",
                                    content=payload, headers=sig)

    async def deliver(self, raw: str, delivery_id: str | None = None, *, tenant: str = "acme",
                      mailbox: str = "sales@acme.test") -> str:
        """Post and expect `accepted`; returns the workflow ID."""
        response = await self.post(raw, delivery_id, tenant=tenant, mailbox=mailbox)
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "accepted", response.text
        return str(response.json()["workflow_id"])

    # --- store ---------------------------------------------------------------------------
    async def state(self, workflow_id: str) -> tuple[str | None, str | None]:
        row = await events.state_of_workflow(self.db, workflow_id=workflow_id)
        return (row["state"], row["reason"]) if row else (None, None)

    async def wait_state(self, workflow_id: str, states: set[str] | str,
                         timeout: float = 60) -> tuple[str, str | None]:
        wanted = {states} if isinstance(states, str) else states
        deadline = time.monotonic() + timeout
        state: str | None = None
        reason: str | None = None
        while time.monotonic() < deadline:
            state, reason = await self.state(workflow_id)
            if state in wanted:
                return state, reason
            await asyncio.sleep(0.2)
        raise AssertionError(f"{workflow_id} stayed {state} ({reason}); wanted {wanted}")

    async def wait_for(self, probe: Callable[[], Awaitable[Any]], timeout: float = 30,
                       what: str = "condition") -> Any:
        """Poll `probe` until it returns something truthy; return that."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await probe()
            if value:
                return value
            await asyncio.sleep(0.05)
        raise AssertionError(f"{what} not reached within {timeout:.0f}s")

    async def operation(self, op_key: str) -> asyncpg.Record | None:
        return await ledger.operation_row(self.db, op_key=op_key)

    async def wait_operation(self, op_key: str, status: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = await self.operation(op_key)
            if row is not None and row["status"] == status:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{op_key} never reached {status}")

    async def count(self, sql: str, *args: Any) -> int:
        """A test's own count statement (the tests write their SQL; the product does not)."""
        return await store_db.count(self.db, sql, *args)

    async def contacts_for(self, email: str) -> int:
        return await contacts.count_by_address(self.db, email=email)

    # --- destination ---------------------------------------------------------------------
    async def sandbox_state(self) -> dict[str, Any]:
        response = await self.http.get(f"{self.endpoints.sandbox_url}/_sandbox/state")
        response.raise_for_status()
        return dict(response.json())

    async def crm_records_for(self, email: str) -> list[dict[str, Any]]:
        state = await self.sandbox_state()
        return [c for c in state["contacts"]
                if str(c["properties"].get("email", "")).lower() == email.lower()]

    async def emails_to(self, email: str) -> list[dict[str, Any]]:
        state = await self.sandbox_state()
        return [m for m in state["emails"] if email.lower() in [t.lower() for t in m["to"]]]

    async def calls(self, target: str) -> list[dict[str, Any]]:
        response = await self.http.get(f"{self.endpoints.sandbox_url}/_sandbox/calls",
                                       params={"target": target})
        response.raise_for_status()
        return list(response.json()["calls"])

    async def inject(self, target: str, mode: str, count: int = 1,
                     retry_after: float | None = None, policy: str | None = None) -> None:
        """Queue a sandbox fault; `policy` names HubSpot's 429 limit (e.g. DAILY)."""
        body: dict[str, Any] = {"target": target, "mode": mode, "count": count}
        if retry_after is not None:
            body["retry_after"] = retry_after
        if policy is not None:
            body["policy"] = policy
        response = await self.http.post(f"{self.endpoints.sandbox_url}/_sandbox/faults", json=body)
        response.raise_for_status()

    async def release_held(self) -> None:
        """Let the requests `hold_before_commit` faults hold go on (each answered 504)."""
        response = await self.http.post(f"{self.endpoints.sandbox_url}/_sandbox/faults/release")
        response.raise_for_status()

    async def reset_faults(self) -> None:
        await self.http.delete(f"{self.endpoints.sandbox_url}/_sandbox/faults")
        await self.sandbox_config(search_lag_seconds=2, hang_seconds=6)
        await self.move_sandbox_clock(offset_seconds=0)

    async def move_sandbox_clock(self, *, advance_seconds: float | None = None,
                                 offset_seconds: float | None = None) -> None:
        """Move the sandbox's time (its idempotency keys expire 24 h after first use)."""
        body = ({"advance_seconds": advance_seconds} if advance_seconds is not None
                else {"offset_seconds": offset_seconds})
        response = await self.http.post(f"{self.endpoints.sandbox_url}/_sandbox/clock",
                                        json=body)
        response.raise_for_status()

    async def sandbox_config(self, **values: float) -> None:
        response = await self.http.post(f"{self.endpoints.sandbox_url}/_sandbox/config",
                                        json=values)
        response.raise_for_status()

    # --- Temporal ------------------------------------------------------------------------
    async def temporal(self, tenant: str | None = None) -> Client:
        """The stack's Temporal, in `tenant`'s namespace (None: the shared one)."""
        if self._temporal is None:
            if self.settings is not None:  # the stack's own data converter (codec)
                self._temporal = await temporal.connect(self.settings)
            else:
                self._temporal = await Client.connect(self.endpoints.temporal_address)
        if tenant is None or self.settings is None:
            return self._temporal
        return temporal.in_namespace(self._temporal,
                                     temporal.namespace_for(self.settings, tenant))

    async def for_workflow(self, workflow_id: str) -> Client:
        """The stack's Temporal in the namespace of the workflow's tenant."""
        return await self.temporal(tenant_of_workflow(workflow_id))

    async def signal(self, workflow_id: str, action: str, body: Any) -> None:
        client = await self.for_workflow(workflow_id)
        await client.get_workflow_handle(workflow_id).signal(action, body)

    async def query_status(self, workflow_id: str) -> dict[str, Any]:
        client = await self.for_workflow(workflow_id)
        return dict(await client.get_workflow_handle(workflow_id).query(QUERY_STATUS))
