"""Suppressing an identity: the one place that writes a suppression, cancels the identity's
queued follow-ups and marks its contact, in the caller's transaction. Used by an opt-out
email (inboxcrm/activities/match.py), by one-click unsubscribe (inboxcrm/ingress/unsubscribe.py) and
by a hard bounce or abuse report of our own follow-up (inboxcrm/activities/extract.py).

Ordering against a send: both sides lock the contact row first (the send with FOR SHARE,
while it checks eligibility and takes its lease). If a send already holds a live lease, its
email may be on the wire: the suppression waits (`SendInFlight`) instead of being recorded
"before" an email that then arrives after it. Either the send sees the suppression and
stops, or the suppression is recorded after the send finished — never interleaved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

LOCK_IDENTITY = """
SELECT contact_id FROM contacts WHERE tenant = $1 AND canonical_email = $2 FOR UPDATE
"""

SEND_IN_FLIGHT = """
SELECT extract(epoch FROM max(i.lease_until) - clock_timestamp())
FROM followup_intents i JOIN contacts c ON c.contact_id = i.contact_id
WHERE c.tenant = $1 AND c.canonical_email = $2
  AND i.status = 'sending' AND i.lease_until > clock_timestamp()
"""

ADD_SUPPRESSION = """
INSERT INTO suppressions (tenant, canonical_email, reason, source, created_at)
VALUES ($1, $2, $3, $4, clock_timestamp()) ON CONFLICT DO NOTHING
RETURNING true
"""

CANCEL_QUEUED_INTENTS = """
UPDATE followup_intents AS i SET status = 'cancelled', cancel_reason = $3
FROM contacts AS c
WHERE i.contact_id = c.contact_id AND c.tenant = $1 AND c.canonical_email = $2
  AND i.status IN ('queued', 'awaiting_approval')
RETURNING i.intent_id
"""

MARK_CONTACT_SUPPRESSED = """
UPDATE contacts SET status = 'suppressed', updated_at = now()
WHERE tenant = $1 AND canonical_email = $2 AND status <> 'suppressed'
RETURNING contact_id
"""


# Did we mail this identity? Only a report about our own follow-up suppresses: anyone can
# write a bounce, and a forged one must not silence an address we never wrote to.
FOLLOWUP_SENT_TO = """
SELECT EXISTS (
    SELECT 1 FROM followup_intents i JOIN contacts c ON c.contact_id = i.contact_id
    WHERE c.tenant = $1 AND c.canonical_email = $2
      AND i.status IN ('sent', 'sending', 'ambiguous')
)
"""


class SendInFlight(Exception):
    """A follow-up to this identity is being submitted right now; try again after
    `retry_after` seconds (at most the send attempt's lease)."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"a send is in flight; retry in {retry_after:.1f}s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Suppression:
    added: bool
    cancelled_intents: list[str]
    contacts_marked: int

    @property
    def changed(self) -> bool:
        return self.added or bool(self.cancelled_intents) or self.contacts_marked > 0


async def lock_identity(conn: Conn, *, tenant: str, canonical_email: str) -> Any:
    """The identity's contact row locked FOR UPDATE (as `suppress_identity` locks it first);
    its contact_id, None when it has no contact."""
    rows = await conn.fetch(LOCK_IDENTITY, tenant, canonical_email)
    return rows[0]["contact_id"] if rows else None


async def suppress_identity(conn: Conn, tenant: str, canonical_email: str, *, reason: str,
                            source: str, cancel_reason: str, locked: bool = False
                            ) -> Suppression:
    """Idempotent: repeating it changes nothing and says so (`changed` is False).
    Raises SendInFlight (writing nothing) while a send to the identity holds its lease.
    `locked`: the caller took `lock_identity` in this transaction already."""
    if not locked:
        await conn.fetch(LOCK_IDENTITY, tenant, canonical_email)
    in_flight = await conn.fetchval(SEND_IN_FLIGHT, tenant, canonical_email)
    if in_flight is not None and in_flight > 0:
        raise SendInFlight(float(in_flight) + 0.5)
    added = bool(await conn.fetchval(ADD_SUPPRESSION, tenant, canonical_email, reason, source))
    cancelled = [str(r["intent_id"]) for r in await conn.fetch(
        CANCEL_QUEUED_INTENTS, tenant, canonical_email, cancel_reason)]
    marked = await conn.fetch(MARK_CONTACT_SUPPRESSED, tenant, canonical_email)
    return Suppression(added, cancelled, len(marked))


async def suppress_reported(conn: Conn, tenant: str, identities: list[str], *, reason: str,
                            source: str) -> list[str]:
    """A hard bounce (`bounced`) or an abuse report (`complaint`) about our mail: suppress
    each reported identity we sent a follow-up to. Returns the identities suppressed now
    (already suppressed ones are not repeated). Raises SendInFlight as suppress_identity."""
    suppressed = []
    for identity in identities:
        if not await conn.fetchval(FOLLOWUP_SENT_TO, tenant, identity):
            continue
        done = await suppress_identity(conn, tenant, identity, reason=reason, source=source,
                                       cancel_reason=reason)
        if done.changed:
            suppressed.append(identity)
    return suppressed
