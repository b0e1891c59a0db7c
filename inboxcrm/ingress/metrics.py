"""Prometheus metrics of the relay, served by an internal listener of their own
(`INBOXCRM_RELAY_METRICS_ADDRESS`, default 127.0.0.1:9465), never on the public port.
Counters for what the relay sees; gauges read from PostgreSQL every
`INBOXCRM_RELAY_METRICS_INTERVAL_SECONDS` (not per scrape: a scrape costs no query), so every
relay replica reports the same truth about the store, at most one interval old.

Labels are low-cardinality enums (source, outcome, state) — never addresses, subjects,
delivery IDs or tenants' customers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any
from wsgiref.simple_server import WSGIServer

import asyncpg
from prometheus_client import CollectorRegistry, Counter, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inboxcrm.platform import conflicts
from inboxcrm.schemas.drift import DriftKind
from inboxcrm.store import gauges

log = logging.getLogger("inboxcrm.ingress.metrics")

DELIVERIES = "inboxcrm_deliveries_received"
SIGNATURE_FAILURES = "inboxcrm_signature_failures"
UNIQUE_CONFLICTS = conflicts.NAME

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
        # The relay's share of the counter the workers export too (its one kind here:
        # intake_delivery); the alert sums both.
        self.unique_conflicts = Counter(UNIQUE_CONFLICTS, conflicts.DESCRIPTION, ["kind"],
                                        registry=self.registry)
        self._store = _StoreCollector()
        self.registry.register(self._store)

    async def refresh(self, pool: asyncpg.Pool) -> None:
        """Read the store gauges (one query) into the snapshot that scrapes render."""
        try:
            async with pool.acquire(timeout=5) as conn:
                row = await conn.fetchrow(gauges.STORE_GAUGES)
            self._store.update(dict(row) if row is not None else None)
        except (OSError, TimeoutError, asyncpg.PostgresError):
            self._store.update(None)

    async def refresh_forever(self, pool: asyncpg.Pool, interval_seconds: float) -> None:
        while True:
            await self.refresh(pool)
            await asyncio.sleep(interval_seconds)

    def render(self) -> bytes:
        """Everything, from memory (the last refresh for the store gauges)."""
        return bytes(generate_latest(self.registry))

    def serve(self, address: str) -> WSGIServer:
        """The internal listener (`host:port`) in a thread of its own; `shutdown()` it."""
        host, _, port = address.rpartition(":")
        server, _thread = start_http_server(int(port), host or "127.0.0.1",
                                            registry=self.registry)
        log.info("relay metrics on http://%s/metrics", address)
        return server


class _StoreCollector(Collector):
    def __init__(self) -> None:
        self.snapshot: dict[str, Any] | None = None
        self.read_at = 0.0  # time.time() of the snapshot

    def update(self, snapshot: dict[str, Any] | None) -> None:
        self.snapshot, self.read_at = snapshot, time.time()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("inboxcrm_store_up",
                               "1 if the store answered the latest gauge refresh")
        up.add_metric([], 0 if self.snapshot is None else 1)
        yield up
        read = GaugeMetricFamily("inboxcrm_store_gauges_read_timestamp_seconds",
                                 "When the store gauges were last read")
        read.add_metric([], self.read_at)
        yield read
        snap = self.snapshot
        if snap is None:
            return
        # The oldest open task keeps ageing between refreshes.
        snap = snap.copy()
        if snap["oldest_age"]:
            snap["oldest_age"] = float(snap["oldest_age"]) + max(time.time() - self.read_at, 0)
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
        yield from _mailbox_gauges(snap.get("mailboxes") or [])
        yield from _drift_gauges(snap["drift"])


def _mailbox_gauges(rows: list[dict[str, Any]]) -> Iterator[GaugeMetricFamily]:
    """Mailbox folders by kind and state, and how long the stalest watching one of each kind
    has gone without a catch-up (docs/mailboxes.md, "Alerts")."""
    folders = GaugeMetricFamily("inboxcrm_mailbox_folders",
                                "Registered mailbox folders by kind and watcher state",
                                labels=["kind", "state"])
    stale = GaugeMetricFamily(
        "inboxcrm_mailbox_oldest_check_age_seconds",
        "Longest time since a watching mailbox folder of this kind was read up to date",
        labels=["kind"])
    expiry = GaugeMetricFamily(
        "inboxcrm_mailbox_subscription_expiry_seconds",
        "Shortest time left before a watching push mailbox's subscription (Gmail watch, "
        "Graph subscription) of this kind lapses; negative: lapsed", labels=["kind"])
    ages: dict[str, float] = {}
    expiries: dict[str, float] = {}
    for row in rows:
        kind = row["kind"]
        folders.add_metric([kind, row["state"]], float(row["n"] or 0))
        if row["oldest_check_age"] is not None:
            ages[kind] = max(ages.get(kind, 0.0), float(row["oldest_check_age"]))
        if row.get("soonest_expiry") is not None:
            left = float(row["soonest_expiry"])
            expiries[kind] = min(expiries.get(kind, left), left)
    for kind, age in sorted(ages.items()):
        stale.add_metric([kind], age)
    for kind, left in sorted(expiries.items()):
        expiry.add_metric([kind], left)
    yield folders
    yield stale
    yield expiry


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
