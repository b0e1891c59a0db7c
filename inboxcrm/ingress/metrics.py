"""Prometheus metrics of the relay. Counters for what the relay sees; gauges read from
PostgreSQL at scrape time, so every relay replica reports the same truth about the store.

Labels are low-cardinality enums (source, outcome, state) — never addresses, subjects,
delivery IDs or tenants' customers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inboxcrm.store.drift import DUPLICATE_MESSAGE_IDS_ALL, LATEST_SCHEDULED_GAUGES
from schemas.drift import DriftKind

DELIVERIES = "inboxcrm_deliveries_received"
SIGNATURE_FAILURES = "inboxcrm_signature_failures"

# The latest accepted delivery per source: a loose index scan over
# inbound_events (source, received_at), one index probe per source, not a table scan.
LAST_DELIVERY_PER_SOURCE = """
WITH RECURSIVE sources AS (
    (SELECT source FROM inbound_events ORDER BY source LIMIT 1)
    UNION ALL
    SELECT (SELECT e.source FROM inbound_events e WHERE e.source > s.source
            ORDER BY e.source LIMIT 1)
    FROM sources s WHERE s.source IS NOT NULL)
SELECT coalesce(jsonb_object_agg(source, (
    SELECT extract(epoch FROM max(e.received_at)) FROM inbound_events e
    WHERE e.source = sources.source)), '{}')
FROM sources WHERE source IS NOT NULL
"""

STORE_GAUGES = f"""
SELECT
  (SELECT coalesce(jsonb_object_agg(state, n), '{{}}') FROM
     (SELECT state, count(*) AS n FROM inbound_events GROUP BY state) s) AS items,
  (SELECT count(*) FROM review_tasks WHERE status = 'open') AS queue_size,
  (SELECT coalesce(extract(epoch FROM now() - min(first_seen)), 0)
     FROM review_tasks WHERE status = 'open') AS oldest_age,
  (SELECT count(*) FROM review_tasks WHERE status = 'open' AND escalate_at <= now())
     AS overdue,
  (SELECT count(*) FROM followup_intents WHERE status = 'sending' AND lease_until < now())
     AS stuck_sending,
  (SELECT count(*) FROM ({DUPLICATE_MESSAGE_IDS_ALL}) d) AS duplicate_message_ids,
  (SELECT count(*) FROM followup_intents
     WHERE status = 'cancelled' AND cancel_reason IN ('suppressed', 'opt_out',
                                                      'unsubscribed')) AS suppression_blocks,
  (SELECT count(*) FROM audit_log WHERE action = 'redelivery_content_differs')
     AS redelivery_mismatches,
  (SELECT count(*) FROM audit_log WHERE action = 'attempt_failed'
     AND detail ->> 'reason' = 'response_mismatch') AS provider_response_mismatches,
  (SELECT count(*) FROM inbound_events WHERE workflow_started_at IS NULL) AS unstarted,
  (SELECT count(*) FROM review_tasks WHERE status = 'open' AND reason = 'candidates')
     AS ambiguous_matches,
  (SELECT count(*) FROM review_tasks WHERE status = 'open' AND reason = 'ramp_limit')
     AS ramp_held,
  ({LAST_DELIVERY_PER_SOURCE}) AS last_delivery,
  ({LATEST_SCHEDULED_GAUGES}) AS drift
"""


class RelayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.deliveries = Counter(
            DELIVERIES, "Inbound deliveries by source and outcome "
            "(accepted, duplicate, unavailable, rejected)", ["source", "outcome"],
            registry=self.registry)
        self.signature_failures = Counter(
            SIGNATURE_FAILURES, "Deliveries rejected for a bad or missing signature",
            ["source"], registry=self.registry)
        self._store = _StoreCollector()
        self.registry.register(self._store)

    async def render(self, pool: asyncpg.Pool) -> bytes:
        """Refresh the store gauges (one query), then render everything."""
        try:
            async with pool.acquire() as conn:
                row = await conn.fetchrow(STORE_GAUGES)
            self._store.snapshot = dict(row) if row is not None else None
        except (OSError, asyncpg.PostgresError):
            self._store.snapshot = None
        return bytes(generate_latest(self.registry))


class _StoreCollector(Collector):
    def __init__(self) -> None:
        self.snapshot: dict[str, Any] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("inboxcrm_store_up", "1 if the store answered this scrape")
        up.add_metric([], 0 if self.snapshot is None else 1)
        yield up
        snap = self.snapshot
        if snap is None:
            return
        items = GaugeMetricFamily("inboxcrm_items", "Items per state", labels=["state"])
        for state, count in sorted((snap["items"] or {}).items()):
            items.add_metric([state], count)
        yield items
        for name, key, text in (
            ("inboxcrm_review_queue_size", "queue_size", "Open review tasks"),
            ("inboxcrm_review_oldest_age_seconds", "oldest_age",
             "Age of the oldest unresolved review task"),
            ("inboxcrm_review_overdue", "overdue", "Open review tasks past escalation"),
            ("inboxcrm_intents_stuck_sending", "stuck_sending",
             "Follow-ups in 'sending' whose lease expired"),
            ("inboxcrm_duplicate_provider_message_ids", "duplicate_message_ids",
             "Provider message IDs recorded for more than one intent (must be 0)"),
            ("inboxcrm_suppression_blocks", "suppression_blocks",
             "Follow-ups stopped by a suppression or opt-out"),
            ("inboxcrm_redelivery_content_mismatches", "redelivery_mismatches",
             "Redeliveries whose content differed from the stored delivery"),
            ("inboxcrm_provider_response_mismatches", "provider_response_mismatches",
             "Provider answers that claimed success without the record"),
            ("inboxcrm_unstarted_events", "unstarted",
             "Stored deliveries whose workflow is not started yet (sweeper backlog)"),
            ("inboxcrm_ambiguous_matches_open", "ambiguous_matches",
             "Open review tasks for a match with several candidate contacts"),
            ("inboxcrm_ramp_held_open", "ramp_held",
             "Follow-ups a first live run's ramp held for a reviewer, still waiting"),
        ):
            gauge = GaugeMetricFamily(name, text)
            gauge.add_metric([], float(snap[key] or 0))
            yield gauge
        last = GaugeMetricFamily(
            "inboxcrm_last_delivery_timestamp_seconds",
            "Time of the latest accepted (stored) delivery per source", labels=["source"])
        for source, at in sorted((snap["last_delivery"] or {}).items()):
            last.add_metric([source], float(at or 0))
        yield last
        yield from _drift_gauges(snap["drift"])


def _drift_gauges(drift: dict[str, Any] | None) -> Iterator[GaugeMetricFamily]:
    """The latest scheduled drift check (nothing before the first run)."""
    if not drift:
        return
    findings = GaugeMetricFamily(
        "inboxcrm_drift_findings", "Findings of the latest scheduled drift check by kind "
        "(missing, changed, duplicate_message_id: drift; unverifiable, unchecked: not asked)",
        labels=["kind"])
    columns = {DriftKind.MISSING: "missing", DriftKind.CHANGED: "changed",
               DriftKind.DUPLICATE_MESSAGE_ID: "duplicate_message_ids",
               DriftKind.UNVERIFIABLE: "unverifiable", DriftKind.UNCHECKED: "unchecked"}
    for kind, column in columns.items():
        findings.add_metric([kind.value], float(drift.get(column) or 0))
    yield findings
    for name, key, text in (
        ("inboxcrm_drift_sampled", "sampled",
         "Operations the latest scheduled drift check looked at"),
        ("inboxcrm_drift_last_run_timestamp_seconds", "finished_at",
         "When the latest scheduled drift check finished"),
    ):
        gauge = GaugeMetricFamily(name, text)
        gauge.add_metric([], float(drift.get(key) or 0))
        yield gauge
