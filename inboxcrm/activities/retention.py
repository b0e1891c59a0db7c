"""apply_retention: the scheduled retention run (docs/architecture.md §7, "Retention").
Per tenant whose policy sets a `retention` period, bounded batches remove what is past it
(the stored message, evidence, the audit trail), each batch its own transaction, so a run
that stops halfway has lost nothing it still needed and the next run carries on. Every
emptied item says so in its own audit trail; each tenant's run leaves one `retention_run`
entry with the counts.
"""

from __future__ import annotations

import logging

import asyncpg
from temporalio import activity

from inboxcrm.domain.policy import load_policies
from inboxcrm.schemas.contract import RETENTION_ACTIVITY
from inboxcrm.schemas.retention import RetentionInput, RetentionSummary, RetentionTenant
from inboxcrm.store import retention as store

log = logging.getLogger("inboxcrm.retention")

ACTOR = "retention-schedule"


class RetentionActivities:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn(name=RETENTION_ACTIVITY)
    async def apply_retention(self, request: RetentionInput) -> RetentionSummary:
        summary = RetentionSummary()
        for tenant, policy in sorted(load_policies().items()):
            periods = policy.retention
            if periods.raw_days is None and periods.evidence_days is None \
                    and periods.audit_days is None:
                continue
            total = store.RetentionReport()
            more_due = True
            for _ in range(request.max_batches_per_tenant):
                activity.heartbeat(tenant)
                async with self._pool.acquire() as conn:
                    batch = await store.retain_batch(
                        conn, tenant=tenant, raw_days=periods.raw_days,
                        evidence_days=periods.evidence_days, audit_days=periods.audit_days,
                        limit=request.batch_size, actor=ACTOR)
                total += batch
                if max(batch.raw, batch.evidence, batch.audit) < request.batch_size:
                    more_due = False
                    break
            async with self._pool.acquire() as conn:
                await store.record_retention_run(conn, tenant=tenant, actor=ACTOR,
                                                 report=total,
                                                 periods=periods.model_dump())
            log.info("retention applied: tenant=%s raw=%d evidence=%d audit=%d more_due=%s",
                     tenant, total.raw, total.evidence, total.audit, more_due)
            summary.tenants.append(RetentionTenant(tenant, total.raw, total.evidence,
                                                   total.audit, more_due))
        return summary
