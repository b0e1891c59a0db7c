"""Suppressing an identity: the one place that writes a suppression, cancels the identity's
queued follow-ups and marks its contact, in the caller's transaction. Used by an opt-out
email (activities/match.py) and by one-click unsubscribe (inboxcrm/unsubscribe.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from activities.store import Conn

ADD_SUPPRESSION = """
INSERT INTO suppressions (tenant, canonical_email, reason, source)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING
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


@dataclass(frozen=True)
class Suppression:
    added: bool
    cancelled_intents: list[str]
    contacts_marked: int

    @property
    def changed(self) -> bool:
        return self.added or bool(self.cancelled_intents) or self.contacts_marked > 0


async def suppress_identity(conn: Conn, tenant: str, canonical_email: str, *, reason: str,
                            source: str, cancel_reason: str) -> Suppression:
    """Idempotent: repeating it changes nothing and says so (`changed` is False)."""
    added = bool(await conn.fetchval(ADD_SUPPRESSION, tenant, canonical_email, reason, source))
    cancelled = [str(r["intent_id"]) for r in await conn.fetch(
        CANCEL_QUEUED_INTENTS, tenant, canonical_email, cancel_reason)]
    marked = await conn.fetch(MARK_CONTACT_SUPPRESSED, tenant, canonical_email)
    return Suppression(added, cancelled, len(marked))
