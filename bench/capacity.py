"""Capacity model: size a deployment for a rate of emails per second from the measured
per-item costs of a benchmark run (docs/capacity.md explains every figure and assumption).

    python -m bench.capacity --rate 1000                  # reads bench/results/latest.json
    python -m bench.capacity --rate 10 --rate 100 --rate 1000 --tenants 500 --json

Inputs, all per item and taken from the results JSON (`make bench`): CPU ms by role (the
median of the measured rounds), PostgreSQL round trips and statements, history events by
type, table and WAL bytes, provider calls (from the profiled run). Provider and Temporal
Cloud limits are the documented defaults (constants below, with their sources); every one
can be overridden on the command line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LATEST = ROOT / "bench" / "results" / "latest.json"

# Documented limits (docs/capacity.md cites them):
# - Temporal Cloud: a namespace starts at 500 actions per second; on-demand capacity grows
#   with the last 7 days of use, provisioned capacity is bought in steps (Cloud "limits").
TEMPORAL_CLOUD_DEFAULT_APS = 500.0
# - HubSpot private app on a Professional portal: 190 requests per 10 s, 650,000 a day
#   (Enterprise: 1,000,000 a day; the API limit increase pack: 250 per 10 s, +1,000,000 a
#   day). Limits are per portal, shared by every app in it.
HUBSPOT_BURST_PER_SECOND = 19.0
HUBSPOT_DAILY = 650_000.0
# - Resend: 2 requests per second per team by default (raised on request).
RESEND_PER_SECOND = 2.0

# Planning margins: run a core at most this busy (bursts, retries, GC, a replica down).
CPU_UTILISATION = 0.6
# One worker or relay replica is one core (deploy/k8s: `cpu: "1"`; a Python process keeps
# about one core busy).
CORES_PER_REPLICA = 1.0
# The largest single PostgreSQL primary we plan for (vCPUs); past it the store is split.
DB_MAX_CORES = 32.0
# Connection pools: the worker's asyncpg pool (inboxcrm/worker.py) and the relay's.
WORKER_POOL = 20
RELAY_POOL = 20  # INBOXCRM_RELAY_POOL_SIZE
MIN_REPLICAS = 2  # one can be down (rollout, node loss)
# A worker holds at most this many items at once (INBOXCRM_MAX_CONCURRENT_WORKFLOW_TASKS, the
# product's default): an item holds its slot from its first step to its last, waiting on
# its providers included, so slow providers bind before CPU does.
SLOTS_PER_WORKER = 6
# What one call to a real CRM or mail API takes (the sandbox answers in about a millisecond):
# a planning figure for HubSpot, Salesforce, Pipedrive and Resend from the same region, not
# a measurement here; give yours with --provider-latency-ms.
PROVIDER_LATENCY_MS = 250.0


@dataclass
class Costs:
    """What one item costs, as measured (per distinct email; duplicates included)."""

    worker_cpu_ms: float
    relay_cpu_ms: float
    postgres_cpu_ms: float
    temporal_cpu_ms: float
    db_round_trips: float
    db_statements: float
    table_bytes: float
    wal_bytes: float
    history_events: float
    history_bytes: float
    actions_low: float   # local activities counted once per workflow task
    actions_high: float  # each local activity counted
    crm_calls: float
    mail_calls: float
    source: str = ""
    notes: list[str] = field(default_factory=list)


def costs_from(result: dict[str, Any], source: str = "") -> Costs:
    """The per-item costs in a benchmark results document."""
    tp = result.get("throughput") or {}
    cpu = (tp.get("cpu_per_item") or {}).get("product")
    prof = tp.get("profiled_run") or {}
    if not cpu or not prof.get("history"):
        raise ValueError("the results have no per-item CPU or profiled run: run `make bench` "
                         "on a version with the profiled run (bench/profile.py)")
    notes: list[str] = []
    pg = prof.get("postgres") or {}
    product_db, sandbox_db = pg.get("product") or {}, pg.get("sandbox") or {}
    trips = float(product_db.get("round_trips_per_item", 0.0))
    other = float(sandbox_db.get("round_trips_per_item", 0.0))
    # Where the bench's PostgreSQL also served the sandbox (the CRM and mail stand-in; runs
    # before it had a server of its own, `sandbox-postgres`), charge the product its share of
    # the server's CPU by round trips.
    shared = "sandbox-postgres" not in cpu
    share = trips / (trips + other) if shared and trips + other else 1.0
    if shared and other:
        notes.append(f"PostgreSQL CPU charged to the product by its share of round trips "
                     f"({share:.0%}); the rest served the sandbox (destination stand-in)")
    events = prof["history"].get("by_type_per_item") or {}
    upserts = sum(v for k, v in events.items()
                  if k.startswith("UPSERT_WORKFLOW_SEARCH_ATTRIBUTES")
                  and not k.endswith(":TemporalChangeVersion"))
    local = float(events.get("MARKER_RECORDED:core_local_activity", 0.0))
    tasks = float(events.get("WORKFLOW_TASK_COMPLETED", 0.0))
    billed = (float(events.get("WORKFLOW_EXECUTION_STARTED", 0.0)) + upserts
              + float(events.get("TIMER_STARTED", 0.0))
              + float(events.get("WORKFLOW_EXECUTION_SIGNALED", 0.0))
              + float(events.get("WORKFLOW_EXECUTION_UPDATE_ACCEPTED", 0.0))
              + float(events.get("ACTIVITY_TASK_SCHEDULED", 0.0)))
    calls = prof.get("destination_calls_per_item") or {}
    crm = sum(v for k, v in calls.items() if k.startswith("crm."))
    mail = sum(v for k, v in calls.items() if k.startswith("mail."))
    if not calls:
        crm, mail = 3.0, 1.0
        notes.append("provider calls not in the results: assumed 3 CRM calls (contact upsert, "
                     "note, association) and 1 send per item")
    storage = prof.get("storage_bytes_per_item") or {}
    return Costs(
        worker_cpu_ms=float(cpu.get("workers", 0.0)),
        relay_cpu_ms=float(cpu.get("relay", 0.0)),
        postgres_cpu_ms=float(cpu.get("postgres", 0.0)) * share,
        temporal_cpu_ms=float(cpu.get("temporal", 0.0)),
        db_round_trips=trips,
        db_statements=float(product_db.get("statements_per_item", 0.0)),
        table_bytes=float(storage.get("table_bytes", 0.0)),
        wal_bytes=float(storage.get("wal_bytes", 0.0)),
        history_events=float(prof["history"].get("events_per_item", 0.0)),
        history_bytes=float(prof["history"].get("history_bytes_per_item", 0.0)),
        actions_low=billed + min(local, tasks) if local else billed,
        actions_high=billed + local,
        crm_calls=crm, mail_calls=mail, source=source, notes=notes,
    )


@dataclass
class Limits:
    cloud_aps: float = TEMPORAL_CLOUD_DEFAULT_APS
    hubspot_burst_per_second: float = HUBSPOT_BURST_PER_SECOND
    hubspot_daily: float = HUBSPOT_DAILY
    resend_per_second: float = RESEND_PER_SECOND
    db_max_cores: float = DB_MAX_CORES
    utilisation: float = CPU_UTILISATION
    retention_days: float = 30.0
    slots_per_worker: int = SLOTS_PER_WORKER
    provider_latency_ms: float = PROVIDER_LATENCY_MS


@dataclass
class Plan:
    rate: float
    tenants: int
    worker_replicas: int
    worker_replicas_for_cpu: int
    worker_replicas_for_slots: int
    item_seconds: float            # one item's time in a worker slot, provider waits included
    relay_replicas: int
    cloud_actions_per_second: tuple[float, float]
    cloud_capacity_needed: bool
    history_events_per_second: float
    db_cores: float
    db_shards: int
    db_round_trips_per_second: float
    db_connections: int
    db_storage_gib: float
    wal_mib_per_second: float
    per_tenant_rate: float
    per_tenant_crm_calls_per_second: float
    per_tenant_mail_calls_per_second: float
    per_tenant_max_rate: float
    tenants_needed: int
    binding: list[tuple[str, float]]   # (limit, items/s it allows), tightest first

    def summary(self) -> str:
        low, high = self.cloud_actions_per_second
        lines = [
            f"{self.rate:g} emails/s over {self.tenants} tenant(s) "
            f"({self.per_tenant_rate:.3g}/s each)",
            f"  workers         {self.worker_replicas} replicas (1 core each; "
            f"{self.worker_replicas_for_cpu} for CPU, {self.worker_replicas_for_slots} for "
            f"slots: an item holds one for {self.item_seconds:.2f} s with its provider calls)",
            f"  relays          {self.relay_replicas} replicas (1 core each)",
            f"  Temporal Cloud  {low:.0f}-{high:.0f} actions/s "
            + ("(above the default namespace limit: provisioned capacity)"
               if self.cloud_capacity_needed else "(within the default namespace limit)")
            + f"; {self.history_events_per_second:.0f} history events/s",
            f"  PostgreSQL      {self.db_cores:.1f} cores in {self.db_shards} database(s), "
            f"{self.db_round_trips_per_second:.0f} round trips/s, "
            f"{self.db_connections} connections (before a pooler), "
            f"{self.db_storage_gib:.0f} GiB over the retention, "
            f"{self.wal_mib_per_second:.1f} MiB/s WAL",
            f"  per tenant      {self.per_tenant_crm_calls_per_second:.3g} CRM calls/s, "
            f"{self.per_tenant_mail_calls_per_second:.3g} sends/s; its providers allow "
            f"{self.per_tenant_max_rate:.3g} emails/s (>= {self.tenants_needed} tenants "
            "with their own provider accounts needed)",
            "  binds first     " + "; ".join(f"{name} at {rate:.3g}/s"
                                            for name, rate in self.binding[:3]),
        ]
        return "\n".join(lines)


def plan(costs: Costs, rate: float, tenants: int = 1, limits: Limits | None = None) -> Plan:
    """Size one deployment for `rate` emails/s spread evenly over `tenants`."""
    lim = limits or Limits()

    def replicas(cpu_ms: float) -> int:
        return max(MIN_REPLICAS, math.ceil(rate * cpu_ms / 1000 / lim.utilisation
                                           / CORES_PER_REPLICA))

    # Little's law on the slots: items in flight = rate x an item's time in its slot, which
    # is its CPU plus its provider calls one after another (its database round trips are
    # in the measured CPU's wall time, a millisecond each at most).
    item_seconds = (costs.worker_cpu_ms / 1000 + (costs.crm_calls + costs.mail_calls)
                    * lim.provider_latency_ms / 1000)
    for_slots = max(MIN_REPLICAS, math.ceil(rate * item_seconds / lim.utilisation
                                            / max(lim.slots_per_worker, 1)))
    for_cpu = replicas(costs.worker_cpu_ms)
    workers, relays = max(for_cpu, for_slots), replicas(costs.relay_cpu_ms)
    db_cores = rate * costs.postgres_cpu_ms / 1000 / lim.utilisation
    shards = max(1, math.ceil(db_cores / lim.db_max_cores))
    low, high = rate * costs.actions_low, rate * costs.actions_high
    # A provider's account is per tenant at best (HubSpot portal, Resend team): the tightest
    # of its burst, its daily budget and the mail limit.
    crm_rate = min(lim.hubspot_burst_per_second, lim.hubspot_daily / 86_400)
    per_tenant_max = min(crm_rate / costs.crm_calls if costs.crm_calls else math.inf,
                         lim.resend_per_second / costs.mail_calls if costs.mail_calls
                         else math.inf)
    per_tenant = rate / max(tenants, 1)
    binding = sorted([
        ("provider limits of one tenant's accounts (HubSpot daily budget / Resend rate)",
         per_tenant_max * max(tenants, 1)),
        ("Temporal Cloud default namespace actions/s", lim.cloud_aps / costs.actions_high
         if costs.actions_high else math.inf),
        (f"one PostgreSQL primary of {lim.db_max_cores:g} cores",
         lim.db_max_cores * lim.utilisation * 1000 / costs.postgres_cpu_ms
         if costs.postgres_cpu_ms else math.inf),
    ], key=lambda kv: kv[1])
    return Plan(
        rate=rate, tenants=tenants, worker_replicas=workers, worker_replicas_for_cpu=for_cpu,
        worker_replicas_for_slots=for_slots, item_seconds=round(item_seconds, 3),
        relay_replicas=relays,
        cloud_actions_per_second=(round(low, 1), round(high, 1)),
        cloud_capacity_needed=high > lim.cloud_aps,
        history_events_per_second=round(rate * costs.history_events, 1),
        db_cores=round(db_cores, 2), db_shards=shards,
        db_round_trips_per_second=round(rate * costs.db_round_trips),
        db_connections=workers * WORKER_POOL + relays * RELAY_POOL,
        db_storage_gib=round(rate * 86_400 * lim.retention_days * costs.table_bytes / 2**30, 1),
        wal_mib_per_second=round(rate * costs.wal_bytes / 2**20, 2),
        per_tenant_rate=per_tenant,
        per_tenant_crm_calls_per_second=per_tenant * costs.crm_calls,
        per_tenant_mail_calls_per_second=per_tenant * costs.mail_calls,
        per_tenant_max_rate=per_tenant_max,
        tenants_needed=math.ceil(rate / per_tenant_max) if per_tenant_max else 0,
        binding=[(name, round(r, 2)) for name, r in binding],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, action="append",
                        help="emails per second (repeatable; default 10, 100 and 1000)")
    parser.add_argument("--tenants", type=int, default=1,
                        help="tenants the rate is spread over, each with its own provider "
                        "accounts (default 1)")
    parser.add_argument("--results", type=Path, default=LATEST)
    parser.add_argument("--cloud-aps", type=float, default=TEMPORAL_CLOUD_DEFAULT_APS)
    parser.add_argument("--hubspot-daily", type=float, default=HUBSPOT_DAILY)
    parser.add_argument("--resend-per-second", type=float, default=RESEND_PER_SECOND)
    parser.add_argument("--db-max-cores", type=float, default=DB_MAX_CORES)
    parser.add_argument("--retention-days", type=float, default=30.0)
    parser.add_argument("--slots", type=int, default=SLOTS_PER_WORKER,
                        help="items a worker holds at once "
                        "(INBOXCRM_MAX_CONCURRENT_WORKFLOW_TASKS; default %(default)s)")
    parser.add_argument("--provider-latency-ms", type=float, default=PROVIDER_LATENCY_MS,
                        help="one CRM or mail API call (default %(default)s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        costs = costs_from(json.loads(args.results.read_text()), str(args.results))
    except (OSError, ValueError) as exc:
        print(f"capacity: {exc}", file=sys.stderr)
        return 2
    limits = Limits(cloud_aps=args.cloud_aps, hubspot_daily=args.hubspot_daily,
                    resend_per_second=args.resend_per_second, db_max_cores=args.db_max_cores,
                    retention_days=args.retention_days, slots_per_worker=args.slots,
                    provider_latency_ms=args.provider_latency_ms)
    plans = [plan(costs, rate, args.tenants, limits) for rate in args.rate or [10, 100, 1000]]
    if args.json:
        print(json.dumps({"costs": asdict(costs), "limits": asdict(limits),
                          "plans": [asdict(p) for p in plans]}, indent=2))
        return 0
    print(f"per item (from {costs.source}): worker {costs.worker_cpu_ms:.1f} ms CPU, relay "
          f"{costs.relay_cpu_ms:.1f}, PostgreSQL {costs.postgres_cpu_ms:.1f} "
          f"({costs.db_round_trips:.1f} round trips), {costs.history_events:.1f} history "
          f"events, {costs.actions_low:.1f}-{costs.actions_high:.1f} Cloud actions, "
          f"{costs.crm_calls:.2f} CRM calls, {costs.mail_calls:.2f} sends, "
          f"{costs.table_bytes / 1024:.1f} KiB stored")
    for note in costs.notes:
        print(f"note: {note}")
    for p in plans:
        print()
        print(p.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
