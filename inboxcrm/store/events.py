"""The `inbound_events` ledger: one row per delivery (the unique key of docs/architecture.md
§2), with the item's mirrored state, its extraction and its route. The relay inserts; each
step marks the item it works on; operators read it."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import asyncpg

from inboxcrm.platform import atrest
from inboxcrm.store.step_attempts import begin_step_cte, end_step_cte

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

SET_EVENT_STATE = """
UPDATE inbound_events SET state = $2, reason = $3, updated_at = now() WHERE event_id = $1
"""

# --- intake (the relay) ---------------------------------------------------------------------
# `ON CONFLICT DO NOTHING` without a target: the workflow ID is unique too (and derived from
# the delivery key), and a concurrent insert of the same delivery must be a no-op on either
# constraint. Naming only the delivery key made the workflow-ID index raise a unique
# violation under concurrent redeliveries (the request got a 503).
# $1 tenant, $2 source, $3 mailbox, $4 delivery_id, $5 workflow_id, $6 raw,
# $7 content_sha256, $8 size_bytes, $9 the audit actor, $10 the Message-ID (or NULL; the
# tenant's one item per Message-ID and content hash is a unique index too: a copy the caller
# did not see under its lock is a no-op here, never a second item, see store/copies.py);
# $11, $12 the provider's own event and its content type (NULL where the source posts MIME).
INSERT_EVENT = """
WITH inserted AS (
    INSERT INTO inbound_events (event_id, tenant, source, mailbox, delivery_id, workflow_id,
                                raw, content_sha256, size_bytes, message_id)
    VALUES ($13::uuid, $1, $2, $3, $4, $5, $6, $7, $8, $10)
    ON CONFLICT DO NOTHING
    RETURNING event_id
), kept AS (
    INSERT INTO provider_events (event_id, content_type, body)
    SELECT event_id, $12, $11 FROM inserted WHERE $11::bytea IS NOT NULL
), received AS (
    INSERT INTO audit_log (tenant, event_id, workflow_id, actor, action, detail)
    SELECT $1, event_id, $5, $9, 'received', jsonb_build_object(
        'source', $2::text, 'delivery_id', $4::text, 'content_sha256', $7::text,
        'size_bytes', $8::int, 'content_ref', 'inbound_events.raw:' || event_id)
    FROM inserted
)
SELECT event_id, true AS new, 'received' AS state, $7 AS content_sha256, false AS started
FROM inserted
UNION ALL
SELECT event_id, false, state, content_sha256, workflow_started_at IS NOT NULL
FROM inbound_events
WHERE tenant = $1 AND source = $2 AND mailbox = $3 AND delivery_id = $4
  AND NOT EXISTS (SELECT 1 FROM inserted)
"""

FIND_EVENT = """
SELECT event_id, workflow_id, state, content_sha256, workflow_started_at IS NOT NULL AS started
FROM inbound_events WHERE tenant = $1 AND source = $2 AND mailbox = $3 AND delivery_id = $4
"""

MARK_STARTED = """
UPDATE inbound_events SET workflow_started_at = COALESCE(workflow_started_at, now()),
    start_attempts = start_attempts + 1
WHERE event_id = $1
"""

COUNT_START_FAILURE = """
UPDATE inbound_events SET start_attempts = start_attempts + 1 WHERE event_id = $1
"""

UNSTARTED_EVENTS = """
SELECT event_id, tenant, workflow_id FROM inbound_events
WHERE workflow_started_at IS NULL AND received_at < now() - make_interval(secs => $1)
ORDER BY received_at LIMIT $2
"""

# --- extraction (inboxcrm/activities/extract.py) --------------------------------------------------
# Marks the item `extracting` and reads its raw message, its source and any stored
# extraction: one round trip.
# It also counts the attempt (`step_attempts`: $3 workflow ID, $4 step) and fixes the mode
# the item runs under, once: the tenant's `mode` setting now, else the mode its policy starts
# in ($5: true for shadow); a re-run keeps it (docs/architecture.md §6, "Going live").
START_EXTRACTION = f"""
WITH {begin_step_cte("$3", "$4")}
UPDATE inbound_events SET state = $2, reason = NULL, updated_at = now(),
    shadow = COALESCE(shadow, (SELECT s.value ->> 'mode' = 'shadow' FROM settings s
                               WHERE s.tenant = inbound_events.tenant AND s.key = 'mode'), $5)
WHERE event_id = $1
RETURNING raw, source, extraction IS NOT NULL AND route IS NOT NULL AS extracted, route,
          route_reasons, canonical_email IS NOT NULL AS identity_known, shadow,
          (SELECT started FROM counted) AS started
"""

# The same without the raw message or the attempt count: where the extraction itself runs
# elsewhere (the model's task queue), the local step only needs to know whether it is stored
# (and fixes the mode, as START_EXTRACTION does; $3: true for shadow).
MARK_EXTRACTING = """
UPDATE inbound_events SET state = $2, reason = NULL, updated_at = now(),
    shadow = COALESCE(shadow, (SELECT s.value ->> 'mode' = 'shadow' FROM settings s
                               WHERE s.tenant = inbound_events.tenant AND s.key = 'mode'), $3)
WHERE event_id = $1
RETURNING extraction IS NOT NULL AND route IS NOT NULL AS extracted, route, route_reasons,
          canonical_email IS NOT NULL AS identity_known, shadow
"""

# The validated record, its audit entry and the cleared attempt count, atomically in one
# statement. $1 event_id, $2 extraction, $3 route, $4 route reasons, $5 canonical email,
# $6 tenant, $7 workflow_id, $8 audit detail, $9 the step, $10 written_at, $11 languages,
# $12 thread_refs (migration 073).
STORE_EXTRACTION = f"""
WITH stored AS (
    UPDATE inbound_events
    SET extraction = $2, route = $3, route_reasons = $4, canonical_email = $5,
        written_at = $10, languages = $11, thread_refs = $12, updated_at = now()
    WHERE event_id = $1
), {end_step_cte("$7", "$9")}
INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
VALUES ($6, $1, $7, NULL, 'extractor', 'extracted', $8)
"""

# --- planning (inboxcrm/activities/match.py) ------------------------------------------------------
# Loads the event and shows `matching`; the row lock serialises a re-run with a zombie.
# It also says how long the tenant has been live since an operator switched it
# (`inboxcrm mode`; NULL: never switched, or in shadow), which decides whether a ramp
# applies: no extra round trip for a tenant that has none (docs/architecture.md §6).
START_MATCHING = """
UPDATE inbound_events SET state = $2, reason = NULL, updated_at = now()
WHERE event_id = $1
RETURNING event_id, tenant, extraction, route, route_reasons, canonical_email,
          (SELECT extract(epoch FROM now() - (s.value ->> 'since')::timestamptz)
           FROM settings s WHERE s.tenant = inbound_events.tenant AND s.key = 'mode'
             AND s.value ->> 'mode' = 'live') AS live_for_seconds
"""

# --- a reviewer's corrections (inboxcrm/activities/review.py) -------------------------------------
LOAD_EXTRACTION = "SELECT extraction FROM inbound_events WHERE event_id = $1 FOR UPDATE"

STORE_CORRECTION = """
UPDATE inbound_events SET extraction = $2, canonical_email = COALESCE($3, canonical_email),
    updated_at = now()
WHERE event_id = $1
"""

# --- operators and probes ------------------------------------------------------------------
EVENT_OF_WORKFLOW = "SELECT event_id, tenant FROM inbound_events WHERE workflow_id = $1"

STATE_OF_WORKFLOW = "SELECT state, reason FROM inbound_events WHERE workflow_id = $1"


async def set_state(conn: Conn, event_id: str, state: str, reason: str | None) -> None:
    await conn.execute(SET_EVENT_STATE, event_id, state, reason)


async def start_matching(conn: Conn, *, event_id: str, state: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(START_MATCHING, event_id, state)
    return row


async def mark_extracting(conn: Conn | asyncpg.Pool, *, event_id: str, state: str,
                          shadow: bool) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(MARK_EXTRACTING, event_id, state, shadow)
    return row


async def start_extraction(conn: Conn | asyncpg.Pool, *, event_id: str, state: str,
                           workflow_id: str, step: str, shadow: bool) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(START_EXTRACTION, event_id, state,
                                                     workflow_id, step, shadow)
    return row


async def store_extraction(
    conn: Conn | asyncpg.Pool, *, event_id: str, extraction: dict[str, Any], route: str,
    route_reasons: list[str], canonical_email: str | None, tenant: str, workflow_id: str,
    audit_detail: dict[str, Any], step: str, written_at: Any, languages: Any,
    thread_refs: list[str] | None = None,
) -> None:
    await conn.execute(STORE_EXTRACTION, event_id, extraction, route, route_reasons,
                       canonical_email, tenant, workflow_id, audit_detail, step, written_at,
                       languages, thread_refs or [])


async def load_extraction_for_update(conn: Conn, *, event_id: str) -> dict[str, Any] | None:
    value: dict[str, Any] | None = await conn.fetchval(LOAD_EXTRACTION, event_id)
    return value


async def store_correction(conn: Conn, *, event_id: str, extraction: dict[str, Any],
                           canonical_email: str | None) -> None:
    await conn.execute(STORE_CORRECTION, event_id, extraction, canonical_email)


async def state_of_workflow(conn: Conn | asyncpg.Pool, *, workflow_id: str
                            ) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(STATE_OF_WORKFLOW, workflow_id)
    return row


# --- intake (the relay): for inboxcrm/ingress/intake.py to call in place of the constants
async def insert_event(conn: Conn, *, tenant: str, source: str, mailbox: str,
                       delivery_id: str, workflow_id: str, raw: bytes, content_sha256: str,
                       size_bytes: int, actor: str, message_id: str | None = None,
                       provider_event: bytes | None = None,
                       provider_event_type: str | None = None) -> asyncpg.Record | None:
    """The new event with its `received` audit entry (and the provider's own event, where
    given), or the existing one (INSERT_EVENT). The message and the provider's event are
    sealed here, in the writing process (inboxcrm/platform/atrest.py), bound to the event ID
    chosen here (so the ID is known before the row exists; a delivery already stored keeps its
    own row and values); `content_sha256` and `size_bytes` describe the plaintext."""
    event_id = str(uuid.uuid4())  # the row the sealed values are bound to
    sealed_event = (atrest.seal(provider_event, tenant=tenant, column=atrest.PROVIDER_EVENT,
                                row=event_id)
                    if provider_event is not None else None)
    row: asyncpg.Record | None = await conn.fetchrow(
        INSERT_EVENT, tenant, source, mailbox, delivery_id, workflow_id,
        atrest.seal(raw, tenant=tenant, column=atrest.RAW, row=event_id), content_sha256,
        size_bytes, actor, message_id, sealed_event, provider_event_type, event_id)
    return row


async def find_event(conn: Conn, *, tenant: str, source: str, mailbox: str,
                     delivery_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(FIND_EVENT, tenant, source, mailbox,
                                                     delivery_id)
    return row


async def mark_started(conn: Conn, *, event_id: str) -> None:
    await conn.execute(MARK_STARTED, event_id)


async def count_start_failure(conn: Conn, *, event_id: str) -> None:
    await conn.execute(COUNT_START_FAILURE, event_id)


async def unstarted_events(conn: Conn, *, min_age_seconds: float, limit: int
                           ) -> list[asyncpg.Record]:
    return list(await conn.fetch(UNSTARTED_EVENTS, min_age_seconds, limit))
