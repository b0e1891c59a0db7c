"""check_destination_drift: ask the destinations, through the adapters, whether what the
ledger says was completed is still there as we wrote it (docs/architecture.md §4).

A sample of the operations completed in a window is checked one by one:
- a CRM contact by our external ID (the CRM adapter's lookup); when that does not return
  the record we stored, the stored record is read by its CRM ID to tell "deleted" from
  "changed behind our back" (our external-ID property gone to another contact);
- a follow-up by the provider's message ID (the mail adapter's read); SMTP cannot be asked:
  "unverifiable", never "present";
- a note or email activity logged on the contact (the inbound email, the follow-up sent) by
  the key it was logged under (`note_key`, the CRM's unique property): gone, or the key now
  on another activity;
- provider message IDs recorded for two intents, from the ledger.
A lookup that fails (outage, expired credential) is "unchecked", with the error category:
the report never turns an unanswered question into "fine".

Read-only at the destination; the one write is the report row (keyed by the run, so a
retried activity rewrites it instead of adding a second).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

import asyncpg
from temporalio import activity

from inboxcrm.activities.crm import note_key
from inboxcrm.adapters.base import AdapterError, CrmClient, MailClient, Unverifiable
from inboxcrm.adapters.factory import ConfigurationError, Destinations
from inboxcrm.schemas.contract import DRIFT_CHECK_ACTIVITY
from inboxcrm.schemas.drift import (
    LOGGED_ACTIONS,
    DriftCheckRequest,
    DriftFinding,
    DriftKind,
    DriftReport,
    DriftSummary,
)
from inboxcrm.store import drift

# Lookups in flight at once: light on the destination's rate limits, quick for a sample.
CONCURRENCY = 4


class DriftActivities:
    def __init__(self, pool: asyncpg.Pool, crm: CrmClient | Destinations,
                 mail: MailClient | None = None) -> None:
        """`crm`: each tenant's accounts (`Destinations`), or one CRM client (with `mail`)
        for every tenant."""
        self._pool = pool
        self._crm = crm
        self._mail = mail

    @activity.defn(name=DRIFT_CHECK_ACTIVITY)
    async def check_destination_drift(self, request: DriftCheckRequest) -> DriftSummary:
        info = activity.info()
        run_id = info.workflow_id or f"activity:{info.activity_id}"
        report = await run_drift_check(self._pool, self._crm, self._mail, request,
                                       run_id=run_id)
        return report.summary()


async def run_drift_check(pool: asyncpg.Pool, crm: CrmClient | Destinations,
                          mail: MailClient | None, request: DriftCheckRequest, *,
                          run_id: str) -> DriftReport:
    """Sample, check, store and return one report (also `inboxcrm reconcile --since`).
    Each operation is asked of its tenant's account."""
    destinations = crm if isinstance(crm, Destinations) else Destinations.fixed(crm, mail)
    start = datetime.fromisoformat(request.window_start)
    end = datetime.fromisoformat(request.window_end)
    async with pool.acquire() as conn:
        total = await drift.count_completed(conn, start, end)
        sample = await drift.sample_completed(conn, start, end, request.sample_size)
        duplicates = await drift.duplicate_message_ids(conn, start, end)
    checker = _Checker(destinations)
    found = await asyncio.gather(*(checker.check(item) for item in sample))
    report = DriftReport(
        run_id=run_id, trigger=request.trigger, window_start=start.isoformat(),
        window_end=end.isoformat(), crm=_name(destinations.global_crm),
        mail=_name(destinations.global_mail),
        completed_in_window=total, sampled=len(sample),
        findings=[f for f in found if f is not None] + duplicates)
    async with pool.acquire() as conn:
        return await drift.save_report(conn, report)


def _name(client: Callable[[], CrmClient | MailClient]) -> str:
    """The global client's name for the report ("none" where a tool gave none)."""
    try:
        return client().name
    except ConfigurationError:
        return "none"


class _Checker:
    def __init__(self, destinations: Destinations) -> None:
        self._destinations = destinations
        self._slots = asyncio.Semaphore(CONCURRENCY)

    async def check(self, item: drift.Sampled) -> DriftFinding | None:
        logged = item.action in LOGGED_ACTIONS
        subject = (f"logged:{item.op_key}" if logged else
                   f"{'contact' if item.action == 'crm-upsert' else 'intent'}:{item.external_ref}")
        if not (logged or item.external_ref) or not item.destination_id:
            # Completed without a destination reference (e.g. resolved by a reviewer without
            # evidence): nothing to look up.
            return _finding(DriftKind.UNCHECKED, subject, "no_destination_id", item)
        ref = item.external_ref or ""
        async with self._slots:
            tenant = item.tenant or ""
            try:
                if logged:
                    found = await self._logged(self._destinations.crm(tenant), item.action,
                                               item.op_key, item.destination_id)
                elif item.action == "crm-upsert":
                    found = await self._contact(self._destinations.crm(tenant), ref,
                                                item.destination_id)
                else:
                    found = await self._email(self._destinations.mail(tenant), ref,
                                              item.destination_id)
            except ConfigurationError:
                return _finding(DriftKind.UNCHECKED, subject, "permanent:destination_config",
                                item)
            except Unverifiable as exc:
                return _finding(DriftKind.UNVERIFIABLE, subject, str(exc), item)
            except AdapterError as exc:
                detail = f"{exc.classified.category.value}:{exc.classified.reason}"
                return _finding(DriftKind.UNCHECKED, subject, detail, item)
        if found is not None:
            found.op_key = item.op_key
        return found

    async def _contact(self, crm: CrmClient, contact_id: str,
                       record_id: str) -> DriftFinding | None:
        by_external_id = await crm.find_contact(contact_id)
        if by_external_id is not None and by_external_id.record_id == record_id:
            return None  # the common case: one lookup
        stored = await crm.read_contact(record_id)
        return drift.crm_record_drift(
            contact_id, record_id, exists=stored is not None,
            owner=stored.external_id if stored else None,
            found_by_external_id=by_external_id.record_id if by_external_id else None)

    async def _logged(self, crm: CrmClient, action: str, op_key: str,
                      activity_id: str) -> DriftFinding | None:
        """One lookup by the key the activity was logged under, as the step's reconcile does."""
        key = note_key(op_key)
        found = await (crm.find_note(key) if action == "crm-note" else crm.find_email(key))
        return drift.logged_drift(op_key, activity_id, found=found)

    async def _email(self, mail: MailClient, intent_id: str,
                     message_id: str) -> DriftFinding | None:
        sent = await mail.read_sent(message_id)
        return drift.email_drift(intent_id, message_id, exists=sent is not None,
                                 key=sent.idempotency_key if sent else None)


def _finding(kind: DriftKind, subject: str, detail: str, item: drift.Sampled) -> DriftFinding:
    return DriftFinding(kind.value, subject, detail, item.op_key)
