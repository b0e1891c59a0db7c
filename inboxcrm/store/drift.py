"""Destination truth, the store's half: which completed operations to check, the verdicts on
what the destination answered, and the stored drift reports.

The verdicts are shared by the two readers of the destination: the invariant checker
(`inboxcrm check`, which reads the sandbox's whole state) and the drift check (which asks
each destination through its adapter), so both call the same thing drift.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from inboxcrm.schemas.drift import (
    CHECKED_ACTIONS,
    DriftFinding,
    DriftKind,
    DriftReport,
)

if TYPE_CHECKING:
    import asyncpg

    Conn = asyncpg.Connection[Any] | asyncpg.pool.PoolConnectionProxy[Any] | asyncpg.Pool

# $1, $2: the window; $3: the actions. The reference the check needs is the contact's current
# CRM record ID (a reviewer's resolution may have changed it), the intent's message ID, or the
# note's or email activity's CRM ID (the operation's destination ID). A forgotten person's
# CRM record is deleted on purpose (`inboxcrm forget`), with what was logged on it: not drift.
_COMPLETED_IN_WINDOW = """
FROM operations o
JOIN inbound_events e ON e.event_id = o.event_id
LEFT JOIN contacts c ON c.contact_id::text =
    CASE WHEN o.action = 'crm-upsert' THEN o.external_ref END
LEFT JOIN contacts ec ON o.action <> 'crm-upsert' AND ec.contact_id = e.contact_id
LEFT JOIN followup_intents i ON o.action = 'send' AND i.intent_id::text = o.external_ref
WHERE o.status = 'completed' AND o.action = ANY($3::text[])
  AND o.last_transition >= $1 AND o.last_transition < $2
  AND coalesce(c.status, ec.status) IS DISTINCT FROM 'forgotten'
"""

COUNT_COMPLETED = f"SELECT count(*) {_COMPLETED_IN_WINDOW}"

# A uniform random sample, so successive runs cover different operations of a busy window.
SAMPLE_COMPLETED = f"""
SELECT o.op_key, o.action, o.external_ref,
       coalesce(c.crm_record_id, i.provider_message_id, o.destination_id) AS destination_id,
       e.tenant
{_COMPLETED_IN_WINDOW}
ORDER BY random() LIMIT $4
"""

# Provider message IDs recorded for more than one intent (Resend answers a reused
# idempotency key with the first email's ID: two intents must never share one).
DUPLICATE_MESSAGE_IDS_ALL = """
SELECT provider_message_id FROM followup_intents
WHERE provider_message_id IS NOT NULL GROUP BY provider_message_id HAVING count(*) > 1
"""

DUPLICATE_MESSAGE_IDS_IN_WINDOW = """
SELECT provider_message_id, array_agg(intent_id::text ORDER BY intent_id) AS intents
FROM followup_intents
WHERE provider_message_id IN (
    SELECT provider_message_id FROM followup_intents
    WHERE provider_message_id IS NOT NULL AND sent_at >= $1 AND sent_at < $2)
GROUP BY provider_message_id HAVING count(*) > 1
"""

SAVE_REPORT = """
INSERT INTO drift_reports (run_id, trigger, crm, mail, window_start, window_end,
                           completed_in_window, sampled, missing, changed,
                           duplicate_message_ids, unverifiable, unchecked, findings)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT (run_id) DO UPDATE SET
    completed_in_window = EXCLUDED.completed_in_window, sampled = EXCLUDED.sampled,
    missing = EXCLUDED.missing, changed = EXCLUDED.changed,
    duplicate_message_ids = EXCLUDED.duplicate_message_ids,
    unverifiable = EXCLUDED.unverifiable, unchecked = EXCLUDED.unchecked,
    findings = EXCLUDED.findings, finished_at = now()
RETURNING report_id, finished_at
"""

LATEST_REPORT = """
SELECT * FROM drift_reports WHERE trigger = $1 ORDER BY report_id DESC LIMIT 1
"""

# The relay's gauges: the latest scheduled run (one row, or NULL before the first run).
LATEST_SCHEDULED_GAUGES = """
SELECT to_jsonb(r) FROM (
    SELECT extract(epoch FROM finished_at) AS finished_at, sampled, missing, changed,
           duplicate_message_ids, unverifiable, unchecked
    FROM drift_reports WHERE trigger = 'schedule' ORDER BY report_id DESC LIMIT 1) r
"""


@dataclass(frozen=True)
class Sampled:
    """One completed operation to check: the reference we keyed it by and what the
    destination called it."""

    op_key: str
    action: str
    external_ref: str | None
    destination_id: str | None
    tenant: str | None = None  # whose account to ask (each tenant may have its own)


async def count_completed(conn: Conn, start: datetime, end: datetime) -> int:
    return int(await conn.fetchval(COUNT_COMPLETED, start, end, list(CHECKED_ACTIONS)) or 0)


async def sample_completed(conn: Conn, start: datetime, end: datetime,
                           limit: int) -> list[Sampled]:
    rows = await conn.fetch(SAMPLE_COMPLETED, start, end, list(CHECKED_ACTIONS), limit)
    return [Sampled(r["op_key"], r["action"], r["external_ref"], r["destination_id"],
                    r["tenant"]) for r in rows]


async def duplicate_message_ids(conn: Conn, start: datetime,
                                end: datetime) -> list[DriftFinding]:
    rows = await conn.fetch(DUPLICATE_MESSAGE_IDS_IN_WINDOW, start, end)
    return [DriftFinding(DriftKind.DUPLICATE_MESSAGE_ID.value,
                         f"message:{r['provider_message_id']}",
                         "intents:" + ",".join(r["intents"]))
            for r in rows]


async def save_report(conn: Conn, report: DriftReport) -> DriftReport:
    """Store the report (a retried run rewrites its own row); fills report_id. `conn` has
    the JSON codec of `inboxcrm.store.db`."""
    row = await conn.fetchrow(
        SAVE_REPORT, report.run_id, report.trigger, report.crm, report.mail,
        datetime.fromisoformat(report.window_start), datetime.fromisoformat(report.window_end),
        report.completed_in_window, report.sampled, report.count(DriftKind.MISSING),
        report.count(DriftKind.CHANGED), report.count(DriftKind.DUPLICATE_MESSAGE_ID),
        report.count(DriftKind.UNVERIFIABLE), report.count(DriftKind.UNCHECKED),
        [asdict(f) for f in report.findings])
    assert row is not None
    report.report_id = row["report_id"]
    report.finished_at = row["finished_at"].isoformat()
    return report


async def latest_report(conn: Conn, trigger: str) -> DriftReport | None:
    row = await conn.fetchrow(LATEST_REPORT, trigger)
    if row is None:
        return None
    findings = row["findings"]
    return DriftReport(
        run_id=row["run_id"], trigger=row["trigger"],
        window_start=row["window_start"].isoformat(), window_end=row["window_end"].isoformat(),
        crm=row["crm"], mail=row["mail"], completed_in_window=row["completed_in_window"],
        sampled=row["sampled"], findings=[DriftFinding(**f) for f in findings],
        report_id=row["report_id"], finished_at=row["finished_at"].isoformat())


# --- verdicts (pure) --------------------------------------------------------------------
def crm_record_drift(contact_id: str, record_id: str, *, exists: bool, owner: str | None,
                     found_by_external_id: str | None = None) -> DriftFinding | None:
    """The CRM record we stored for a contact, as the destination holds it now.

    `owner`: our external-ID property on that record ("" or None where the record has none:
    an adopted existing record, which never had it). `found_by_external_id`: the record the
    CRM's lookup by our external ID returned, where that was asked."""
    subject = f"contact:{contact_id}"
    if not exists:
        return DriftFinding(DriftKind.MISSING.value, subject, f"missing_record:{record_id}")
    if owner and owner != contact_id:
        return DriftFinding(DriftKind.CHANGED.value, subject,
                            f"record_of_other_contact:{record_id}")
    if found_by_external_id is not None and found_by_external_id != record_id:
        return DriftFinding(DriftKind.CHANGED.value, subject,
                            f"external_id_on_other_record:{found_by_external_id}")
    return None


def logged_drift(op_key: str, activity_id: str, *, found: str | None) -> DriftFinding | None:
    """A note or email activity we logged in the CRM, looked up again by the key we logged it
    under. `found`: the CRM ID that lookup returned (None: nothing carries the key now)."""
    subject = f"logged:{op_key}"
    if found is None:
        return DriftFinding(DriftKind.MISSING.value, subject, f"missing_activity:{activity_id}")
    if found != activity_id:
        return DriftFinding(DriftKind.CHANGED.value, subject, f"key_on_other_activity:{found}")
    return None


def email_drift(intent_id: str, message_id: str, *, exists: bool,
                key: str | None) -> DriftFinding | None:
    """The email recorded for an intent, as the provider holds it now. `key`: the
    idempotency key the provider reports for it (None where it does not say)."""
    subject = f"intent:{intent_id}"
    if not exists:
        return DriftFinding(DriftKind.MISSING.value, subject, f"missing_message:{message_id}")
    if key is not None and key != intent_id:
        return DriftFinding(DriftKind.CHANGED.value, subject,
                            f"message_of_other_intent:{message_id}")
    return None
