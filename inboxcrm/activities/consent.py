"""Consent from both sides (docs/consent.md).

- `CrmOptOutCheck`: the send's last check before the call reads the CRM record's own opt-out
  field (HubSpot `hs_email_optout`, Salesforce `HasOptedOutOfEmail`) through the optional
  `CrmConsent` seam, fresh or from a cache of a few seconds, never from extraction time. A
  CRM client without the seam (or a contact the CRM step never reached) leaves the check to
  inboxcrm's own suppression list, and the audit says so (`checked: inboxcrm_only`).
- `sync_consent_writes` (run by the scheduled ConsentSyncWorkflow): inboxcrm's own
  suppressions, queued as `crm_consent_writes` rows in the suppression's transaction, are
  written to those fields, each as its own operation (`consent/{tenant}/{id}:crm-opt-out`):
  claimed with a lease, bounded attempts with backoff, the outcome and its audit entry
  recorded together. Setting an opt-out is idempotent, so after an unknown outcome the
  repeat is the reconciliation; a permanent refusal or exhausted attempts is `blocked`,
  audited (`crm_opt_out_blocked`) and shown by `inboxcrm audit`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import asyncpg
from temporalio import activity

from inboxcrm.adapters.base import AdapterError, CrmClient, CrmConsent, CrmMerges, OptOut
from inboxcrm.adapters.errors import Category, Classified
from inboxcrm.adapters.factory import ConfigurationError, Destinations
from inboxcrm.schemas.consent import ConsentSyncInput, ConsentSyncSummary
from inboxcrm.schemas.contract import CONSENT_SYNC_ACTIVITY
from inboxcrm.store import consent as store

log = logging.getLogger("inboxcrm.consent")

# A read of the CRM's opt-out is reused for this long (the docs' "cached for seconds").
CACHE_SECONDS = 5.0
CACHE_MAX = 4096
# A claimed write not finished by then is taken over by the next sync.
LEASE_SECONDS = 120.0
# Backoff of a failed write-back: 5 s doubling, capped at an hour (12 attempts ≈ 4.5 h).
RETRY_FIRST = 5.0
RETRY_MAX = 3600.0


@dataclass(frozen=True)
class ConsentView:
    """What the send's consent check found (the audit's `consent` detail)."""

    checked: str                 # "crm_and_inboxcrm" | "inboxcrm_only"
    opted_out: bool = False
    provider: str | None = None
    field: str | None = None
    record_id: str | None = None
    cached: bool = False

    def detail(self) -> dict[str, object]:
        if self.checked == "inboxcrm_only":
            return {"checked": self.checked}
        return {"checked": self.checked, "crm": self.provider, "crm_field": self.field,
                "crm_record_id": self.record_id, "crm_opted_out": self.opted_out,
                "cached": self.cached}


INBOXCRM_ONLY = ConsentView(checked="inboxcrm_only")


class CrmOptOutCheck:
    """The CRM side of the send's consent check, with a short per-worker cache."""

    def __init__(self, cache_seconds: float = CACHE_SECONDS) -> None:
        self._cache_seconds = cache_seconds
        self._cache: dict[tuple[str, str, str], tuple[float, OptOut]] = {}

    async def read(self, tenant: str, crm: CrmClient, record_id: str | None) -> ConsentView:
        if record_id is None or not isinstance(crm, CrmConsent):
            return INBOXCRM_ONLY
        key = (tenant, crm.name, record_id)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self._cache_seconds:
            return _view(crm.name, hit[1], cached=True)
        try:
            found = await self._read_followed(crm, record_id)
        except AdapterError as exc:
            raise _as_read_failure(exc) from None
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()
        self._cache[key] = (now, found)
        return _view(crm.name, found, cached=False)


    @staticmethod
    async def _read_followed(crm: CrmConsent, record_id: str) -> OptOut:
        """The record's opt-out; a record merged away since it was stored (Salesforce answers
        its old ID 404 `ENTITY_IS_DELETED`) is read on its survivor (HubSpot answers the old
        ID with the survivor itself). The stored ID is moved by the next CRM upsert, which
        records the merge (`crm_record_merged`)."""
        try:
            return await crm.read_opt_out(record_id)
        except AdapterError as exc:
            if exc.classified.category is not Category.PERMANENT or \
                    not isinstance(crm, CrmMerges):
                raise
            survivor = await crm.survivor_of(record_id)
            if survivor is None:
                raise
        return await crm.read_opt_out(survivor.record_id)


def _view(provider: str, found: OptOut, *, cached: bool) -> ConsentView:
    return ConsentView(checked="crm_and_inboxcrm", opted_out=found.opted_out,
                       provider=provider, field=found.field, record_id=found.record_id,
                       cached=cached)


def _as_read_failure(exc: AdapterError) -> AdapterError:
    """A read never took effect: an unknown outcome (a timeout) is only transient, never the
    send's "may have gone out". A permanent one (no permission to read the field, the record
    gone) blocks the send: consent that cannot be read is not assumed."""
    c = exc.classified
    if c.category is Category.UNKNOWN:
        return AdapterError(Classified(Category.TRANSIENT, f"consent_read:{c.reason}",
                                       c.retry_after, c.status_code))
    return AdapterError(Classified(c.category, f"consent_read:{c.reason}", c.retry_after,
                                   c.status_code, c.park_until))


class ConsentActivities:
    def __init__(self, pool: asyncpg.Pool, destinations: Destinations) -> None:
        self._pool = pool
        self._destinations = destinations

    @activity.defn(name=CONSENT_SYNC_ACTIVITY)
    async def sync_consent_writes(self, request: ConsentSyncInput) -> ConsentSyncSummary:
        """Write every due opt-out to its tenant's CRM. One failing write never stops the
        others, and the run does not fail for it: the row's own backoff is its retry."""
        summary = ConsentSyncSummary()
        while True:
            async with self._pool.acquire() as conn:
                rows = await store.claim_due(conn, tenant=request.tenant,
                                             limit=request.batch_size,
                                             lease_seconds=LEASE_SECONDS)
            if not rows:
                return summary
            for row in rows:
                activity.heartbeat()
                await self._write(row, summary)
                if row["tenant"] not in summary.tenants:
                    summary.tenants.append(row["tenant"])
            if len(rows) < request.batch_size:
                return summary

    async def _write(self, row: asyncpg.Record, summary: ConsentSyncSummary) -> None:
        op_key, attempt = str(row["op_key"]), int(row["attempts"])
        base = {"op_key": op_key, "reason": row["reason"], "scope": row["scope"],
                "attempt": attempt}
        try:
            crm = self._destinations.crm(row["tenant"])
        except ConfigurationError:
            await self._failed(row, Classified(Category.PERMANENT, "destination_config"),
                               base, summary)
            return
        if not isinstance(crm, CrmConsent):
            # This CRM has no opt-out field we can write (docs/consent.md): the suppression
            # list alone honours the opt-out. Recorded as done, saying so.
            async with self._pool.acquire() as conn:
                await store.record_written(
                    conn, op_key=op_key, attempt=attempt, provider=crm.name, field="",
                    record_ids=(), detail={**base, "crm": crm.name, "supported": False})
            summary.not_supported += 1
            return
        try:
            written = await crm.write_opt_out(str(row["canonical_email"]),
                                              row["crm_record_id"])
        except AdapterError as exc:
            await self._failed(row, exc.classified, {**base, "crm": crm.name,
                                                     "crm_field": crm.consent_field},
                               summary)
            return
        async with self._pool.acquire() as conn:
            await store.record_written(
                conn, op_key=op_key, attempt=attempt, provider=crm.name, field=written.field,
                record_ids=written.record_ids,
                detail={**base, "crm": crm.name, "crm_field": written.field,
                        "crm_record_ids": list(written.record_ids), "supported": True})
        summary.written += 1

    async def _failed(self, row: asyncpg.Record, failure: Classified, base: dict[str, object],
                      summary: ConsentSyncSummary) -> None:
        attempt = int(row["attempts"])
        retry_in: float | None = None
        if failure.category is not Category.PERMANENT and attempt < int(row["max_attempts"]):
            retry_in = min(RETRY_FIRST * 2 ** (attempt - 1), RETRY_MAX)
            if failure.retry_after:
                retry_in = min(max(retry_in, failure.retry_after), RETRY_MAX)
        log.warning("CRM opt-out write %s attempt %d failed: %s %s", row["op_key"], attempt,
                    failure.category.value, failure.reason)
        async with self._pool.acquire() as conn:
            await store.record_failed(
                conn, op_key=str(row["op_key"]), attempt=attempt,
                category=failure.category.value, reason=failure.reason, retry_in=retry_in,
                detail={**base, "category": failure.category.value, "error": failure.reason,
                        "retry_in": retry_in})
        if retry_in is None:
            summary.blocked += 1
        else:
            summary.failed += 1
