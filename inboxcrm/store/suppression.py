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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inboxcrm.store import consent

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

# A suppression is recorded once per identity; a later one of scope `all` widens an earlier
# `marketing` one (and counts as added: the contact is marked, the CRM written to). $5 scope.
ADD_SUPPRESSION = """
INSERT INTO suppressions AS s (tenant, canonical_email, reason, source, created_at, scope)
VALUES ($1, $2, $3, $4, clock_timestamp(), $5)
ON CONFLICT (tenant, canonical_email) DO UPDATE
SET scope = 'all', reason = EXCLUDED.reason, source = EXCLUDED.source
WHERE s.scope <> 'all' AND EXCLUDED.scope = 'all'
RETURNING true
"""

# The queued follow-ups a suppression stops: all of them (scope `all`), or those of the
# tenant's marketing rules ($5) under a `marketing` one ($4).
CANCEL_QUEUED_INTENTS = """
WITH cancelled AS (
    UPDATE followup_intents AS i SET status = 'cancelled', cancel_reason = $3
    FROM contacts AS c
    WHERE i.contact_id = c.contact_id AND c.tenant = $1 AND c.canonical_email = $2
      AND i.status IN ('queued', 'awaiting_approval')
      AND ($4 = 'all' OR i.rule_id = ANY($5::text[]))
    RETURNING i.intent_id
), unlogged AS (  -- their follow-ups' CRM logs (`crm-sent`) will never run
    UPDATE operations SET status = 'cancelled', last_transition = now()
    WHERE action = 'crm-sent' AND status = 'pending'
      AND external_ref IN (SELECT intent_id::text FROM cancelled)
)
SELECT intent_id FROM cancelled
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
    scope: str = "all"
    # The CRM write-back queued with it (docs/consent.md), if any.
    crm_write: str | None = None

    @property
    def changed(self) -> bool:
        return self.added or bool(self.cancelled_intents) or self.contacts_marked > 0


async def lock_identity(conn: Conn, *, tenant: str, canonical_email: str) -> Any:
    """The identity's contact row locked FOR UPDATE (as `suppress_identity` locks it first);
    its contact_id, None when it has no contact."""
    rows = await conn.fetch(LOCK_IDENTITY, tenant, canonical_email)
    return rows[0]["contact_id"] if rows else None


async def suppress_identity(conn: Conn, tenant: str, canonical_email: str, *, reason: str,
                            source: str, cancel_reason: str, locked: bool = False,
                            scope: str = "all", marketing_rules: Sequence[str] = (),
                            write_back: bool = True) -> Suppression:
    """Idempotent: repeating it changes nothing and says so (`changed` is False).
    Raises SendInFlight (writing nothing) while a send to the identity holds its lease.
    `locked`: the caller took `lock_identity` in this transaction already.

    `scope` (the tenant's policy for `reason`, docs/consent.md): `all` stops every follow-up
    and marks the contact suppressed; `marketing` cancels only the follow-ups of
    `marketing_rules` and leaves service replies alone. A new suppression of scope `all` is
    written to the CRM's opt-out field as an operation of its own (`consent.queue_write`),
    queued here, in the same transaction, unless `write_back` is False (shadow mode: nothing
    is written to a destination). A `marketing` one is not: the CRM's field means "no email
    at all", and subscription types are not modelled."""
    if not locked:
        await conn.fetch(LOCK_IDENTITY, tenant, canonical_email)
    in_flight = await conn.fetchval(SEND_IN_FLIGHT, tenant, canonical_email)
    if in_flight is not None and in_flight > 0:
        raise SendInFlight(float(in_flight) + 0.5)
    added = bool(await conn.fetchval(ADD_SUPPRESSION, tenant, canonical_email, reason, source,
                                     scope))
    cancelled = [str(r["intent_id"]) for r in await conn.fetch(
        CANCEL_QUEUED_INTENTS, tenant, canonical_email, cancel_reason, scope,
        list(marketing_rules))]
    marked = (await conn.fetch(MARK_CONTACT_SUPPRESSED, tenant, canonical_email)
              if scope == "all" else [])
    crm_write = None
    if added and scope == "all" and write_back:
        crm_write = await consent.queue_write(conn, tenant=tenant,
                                              canonical_email=canonical_email, reason=reason,
                                              scope=scope)
    return Suppression(added, cancelled, len(marked), scope, crm_write)


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
