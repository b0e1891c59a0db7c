"""The `contacts` table: one row per (tenant, canonical address), the identity every
follow-up and CRM record hangs on (docs/architecture.md §2)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

class CrmOrigin(enum.StrEnum):
    """Where a contact's CRM record came from (`contacts.crm_origin`, migration 080). Only a
    record we created is written over by later upserts; the others are filled, never
    overwritten (`CrmClient.fill_contact`). No origin (NULL) counts as not ours."""

    CREATED = "created"
    ADOPTED = "adopted"
    MERGED = "merged"


# --- planning (inboxcrm/activities/match.py) ------------------------------------------------------
UPSERT_CONTACT = """
INSERT INTO contacts (tenant, canonical_email, email, name, company)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant, canonical_email) DO UPDATE SET updated_at = now()
RETURNING contact_id, name, company, status, (xmax = 0) AS inserted,
    crm_record_id IS NOT NULL AS in_crm
"""

FIND_NAME_CANDIDATES = """
SELECT contact_id FROM contacts
WHERE tenant = $1 AND lower(name) = lower($2)
LIMIT 10
"""

FILL_CONTACT_FIELDS = """
UPDATE contacts SET name = COALESCE($2, name), company = COALESCE($3, company),
    updated_at = now()
WHERE contact_id = $1
"""

# --- the CRM steps (inboxcrm/activities/crm.py) ---------------------------------------------------
LOAD_CONTACT = """
SELECT contact_id, email, name, company, crm_record_id, crm_origin FROM contacts
WHERE contact_id = $1::uuid
"""

# A merge in the CRM followed: the contact's record is the survivor from now on, one a
# salesperson kept (never written over).
RECORD_SURVIVOR = """
UPDATE contacts SET crm_record_id = $2, crm_origin = 'merged', updated_at = now()
WHERE contact_id = $1::uuid
"""

# `written_at`: the message's Date as extraction stored it (migration 041). `head`, the
# stored message, only for an item extracted before that (NULL once purged): the whole
# value, since it is sealed at rest (inboxcrm/platform/atrest.py); the reader opens it and
# keeps its first 64 KiB (`atrest.open_head`).
LOAD_NOTE_CONTEXT = """
SELECT c.crm_record_id, c.contact_id, e.source, e.received_at, e.route,
       e.extraction ->> 'intent' AS intent,
       e.delivery_id, e.written_at,
       e.tenant, CASE WHEN e.languages IS NULL THEN e.raw END AS head
FROM inbound_events e JOIN contacts c ON c.contact_id = e.contact_id
WHERE e.event_id = $1::uuid
"""

# The inbound email as the CRM's email activity (docs/architecture.md §5, "The conversation
# in the CRM"): its contact's record, when it was written and received, and the head of the
# message (its subject and own text; NULL once purged; sealed, opened by the reader with
# `atrest.open_head`).
LOAD_EMAIL_CONTEXT = """
SELECT c.crm_record_id, c.contact_id, e.received_at, e.written_at, e.tenant,
       e.raw AS head
FROM inbound_events e JOIN contacts c ON c.contact_id = e.contact_id
WHERE e.event_id = $1::uuid
"""

# A reviewer's resolve of a CRM upsert names the contact's record ($1 op key, $2 record ID);
# another record than the stored one has no known origin (treated as not ours).
RECORD_RESOLVED_CRM_ID = """
UPDATE contacts SET crm_record_id = $2, updated_at = now(),
    crm_origin = CASE WHEN contacts.crm_record_id IS NOT DISTINCT FROM $2
                      THEN contacts.crm_origin END
FROM operations o
WHERE o.op_key = $1 AND o.action = 'crm-upsert' AND contacts.contact_id = o.external_ref::uuid
"""

# --- one-click unsubscribe (inboxcrm/ingress/unsubscribe.py) -----------------------------
LOCK_CONTACT = """
SELECT contact_id, canonical_email, status FROM contacts
WHERE tenant = $1 AND contact_id = $2
FOR UPDATE
"""

# --- probes (inboxcrm/verify/probe.py) -----------------------------------------------------
COUNT_BY_ADDRESS = "SELECT count(*) FROM contacts WHERE canonical_email = lower($1)"


async def upsert_contact(conn: Conn, *, tenant: str, canonical_email: str, email: str,
                         name: str | None, company: str | None) -> asyncpg.Record | None:
    """The contact of this address, inserted or (row-locked until commit) the stored one."""
    row: asyncpg.Record | None = await conn.fetchrow(UPSERT_CONTACT, tenant, canonical_email,
                                                     email, name, company)
    return row


async def find_name_candidates(conn: Conn, *, tenant: str, name: str) -> list[str]:
    return [str(r["contact_id"]) for r in await conn.fetch(FIND_NAME_CANDIDATES, tenant, name)]


async def fill_contact_fields(conn: Conn, *, contact_id: Any, name: str | None,
                              company: str | None) -> None:
    await conn.execute(FILL_CONTACT_FIELDS, contact_id, name, company)


async def load_contact(conn: Conn, *, contact_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(LOAD_CONTACT, contact_id)
    return row


async def load_note_context(conn: Conn, *, event_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(LOAD_NOTE_CONTEXT, event_id)
    return row


async def load_email_context(conn: Conn, *, event_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(LOAD_EMAIL_CONTEXT, event_id)
    return row


async def record_survivor(conn: Conn, *, contact_id: str, crm_record_id: str) -> None:
    await conn.execute(RECORD_SURVIVOR, contact_id, crm_record_id)


async def record_resolved_crm_id(conn: Conn, *, op_key: str, crm_record_id: str) -> None:
    await conn.execute(RECORD_RESOLVED_CRM_ID, op_key, crm_record_id)


async def count_by_address(conn: Conn | asyncpg.Pool, *, email: str) -> int:
    return int(await conn.fetchval(COUNT_BY_ADDRESS, email))


# One CRM lookup-then-create at a time per contact (CRMs without upsert by our ID), for the
# transaction: a second writer waits, then its lookup finds the first one's record.
LOCK_CRM_CREATE = "SELECT pg_advisory_xact_lock(hashtext('crm-create/' || $1))"


async def lock_crm_create(conn: Conn, *, contact_id: str) -> None:
    await conn.execute(LOCK_CRM_CREATE, contact_id)


async def lock_contact(conn: Conn, *, tenant: str, contact_id: Any) -> asyncpg.Record | None:
    """One-click unsubscribe's contact, row-locked (LOCK_CONTACT)."""
    row: asyncpg.Record | None = await conn.fetchrow(LOCK_CONTACT, tenant, contact_id)
    return row


# The CRM IDs of the notes logged for a contact's items, newest first (a Pipedrive merge
# moves them to the survivor: `CrmMerges.survivor_of(notes=…)`).
LOGGED_NOTE_IDS = """
SELECT o.destination_id FROM operations o JOIN inbound_events e ON e.event_id = o.event_id
WHERE e.contact_id = $1::uuid AND o.action = 'crm-note' AND o.status = 'completed'
  AND o.destination_id IS NOT NULL
ORDER BY o.last_transition DESC LIMIT $2
"""


async def logged_note_ids(conn: Conn | asyncpg.Pool, *, contact_id: str,
                          limit: int = 3) -> tuple[str, ...]:
    rows = await conn.fetch(LOGGED_NOTE_IDS, contact_id, limit)
    return tuple(str(r["destination_id"]) for r in rows)
