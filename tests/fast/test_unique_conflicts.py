"""`inboxcrm_unique_conflicts_total{kind}` (inboxcrm/platform/conflicts.py): counted on the
worker's meter inside a step with only the fixed `kind` label, nothing outside one, and by the
relay for a delivery a concurrent request stored first."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import cast

import asyncpg
from prometheus_client import generate_latest
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

from inboxcrm.ingress.intake import Delivery, IngestResult, Intake
from inboxcrm.ingress.metrics import RelayMetrics
from inboxcrm.platform.conflicts import NAME, ConflictKind, count_conflict


def test_a_conflict_in_a_step_reaches_the_meter_with_its_kind_only() -> None:
    buffer = MetricBuffer(1000)
    env = ActivityEnvironment()
    env.metric_meter = Runtime(telemetry=TelemetryConfig(metrics=buffer)).metric_meter
    env.info = dataclasses.replace(env.info, activity_type="upsert_contact_in_crm",
                                   task_queue="conflicts-test")
    env.run(count_conflict, ConflictKind.CRM_CONTACT_EMAIL)
    env.run(count_conflict, ConflictKind.CRM_CONTACT_EMAIL)
    env.run(count_conflict, ConflictKind.CRM_EMAIL_ACTIVITY)
    totals: dict[str, int] = {}
    for update in buffer.retrieve_updates():
        if update.metric.name == NAME:
            assert set(update.attributes) - {"namespace", "task_queue", "activity_type",
                                               "service_name"} == {
                "kind"}
            kind = str(update.attributes["kind"])
            totals[kind] = totals.get(kind, 0) + int(update.value)
    assert totals == {"crm_contact_email": 2, "crm_email_activity": 1}


def test_outside_a_step_nothing_is_counted_and_nothing_fails() -> None:
    count_conflict(ConflictKind.CRM_CONTACT_EMAIL)  # an operator command calling the adapter


class _Ledger:
    def __init__(self, result: IngestResult) -> None:
        self.result = result
        self.pool = cast(asyncpg.Pool, None)  # not used: the ingest is the fake's

    async def ingest(self, delivery: Delivery) -> IngestResult:
        return self.result


def _relay_count(result: IngestResult) -> float:
    metrics = RelayMetrics()
    delivery = Delivery("acme", "standard", "sales@acme.test", "D-1", b"raw")
    asyncio.run(Intake(_Ledger(result), metrics).ingest(delivery))
    value = metrics.registry.get_sample_value(f"{NAME}_total", {"kind": "intake_delivery"})
    assert f"{NAME}_total".encode() in generate_latest(metrics.registry)
    return value or 0.0


def test_the_relay_counts_a_delivery_a_concurrent_request_stored_first() -> None:
    assert _relay_count(IngestResult("duplicate", "wf", "received", raced=True)) == 1.0
    assert _relay_count(IngestResult("duplicate", "wf", "received")) == 0.0
