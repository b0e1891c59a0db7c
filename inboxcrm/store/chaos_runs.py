"""What the chaos driver (inboxcrm/verify/chaos.py) reads of its own run: the run's items by
state, those still in flight or waiting for a person, the operations they wait on,
whether a signalled item has moved, and the contacts it holds for the senders it seeded as
pre-existing CRM records. $1 is the run's workflow ID prefix where it appears."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncpg

    from inboxcrm.store.db import Conn

STATES_OF_RUN = """
SELECT state, count(*) AS n FROM inbound_events WHERE starts_with(workflow_id, $1)
GROUP BY state
"""

COUNT_IN_STATES = """
SELECT count(*) FROM inbound_events WHERE starts_with(workflow_id, $1)
AND state = ANY($2::text[])
"""

IN_FLIGHT_BY_STATE = """
SELECT e.state, coalesce(e.reason, '') AS reason, count(*) AS n,
       string_agg(DISTINCT o.status || '/' || o.action, ' ') AS ops
FROM inbound_events e LEFT JOIN operations o ON o.workflow_id = e.workflow_id
  AND o.status NOT IN ('completed', 'cancelled')
WHERE starts_with(e.workflow_id, $1) AND e.state = ANY($2::text[])
GROUP BY 1, 2 ORDER BY 3 DESC
"""

REVIEW_ITEMS = """
SELECT e.workflow_id, e.state, e.reason, e.updated_at, r.destination_ref
FROM inbound_events e JOIN review_tasks r
  ON r.workflow_id = e.workflow_id AND r.status = 'open'
WHERE starts_with(e.workflow_id, $1) AND e.state = ANY($2::text[])
ORDER BY r.first_seen
"""

OPERATION_REFS = """
SELECT op_key, action, external_ref, last_error FROM operations
WHERE op_key = ANY($1::text[])
"""

# Moved since its mark, or a decision refused (an audit entry `signal_*` or `update_*`
# not accepted).
MOVED_SINCE = """
SELECT e.workflow_id, e.updated_at > m.mark AS moved,
       EXISTS (SELECT 1 FROM audit_log a WHERE a.workflow_id = e.workflow_id
               AND a.action ~ '^(signal|update)_' AND a.at > m.mark
               AND (a.detail ->> 'accepted') = 'false') AS refused
FROM inbound_events e JOIN unnest($1::text[], $2::timestamptz[])
  AS m(workflow_id, mark) ON m.workflow_id = e.workflow_id
"""

# The tenant's contacts for the given canonical emails (the seeded pre-existing senders).
CONTACTS_FOR_EMAILS = """
SELECT c.contact_id::text AS contact_id, lower(c.canonical_email) AS identity,
       c.crm_record_id
FROM contacts c
WHERE c.tenant = $1 AND lower(c.canonical_email) = ANY($2::text[])
"""


async def states_of_run(conn: Conn | asyncpg.Pool, scope: str) -> list[asyncpg.Record]:
    return list(await conn.fetch(STATES_OF_RUN, scope))


async def count_in_states(conn: Conn | asyncpg.Pool, scope: str, states: list[str]) -> int:
    return int(await conn.fetchval(COUNT_IN_STATES, scope, states))


async def in_flight_by_state(conn: Conn | asyncpg.Pool, scope: str,
                             states: list[str]) -> list[asyncpg.Record]:
    return list(await conn.fetch(IN_FLIGHT_BY_STATE, scope, states))


async def review_items(conn: Conn | asyncpg.Pool, scope: str,
                       states: list[str]) -> list[asyncpg.Record]:
    return list(await conn.fetch(REVIEW_ITEMS, scope, states))


async def operation_refs(conn: Conn | asyncpg.Pool, op_keys: list[str]) -> list[asyncpg.Record]:
    return list(await conn.fetch(OPERATION_REFS, op_keys))


async def moved_since(conn: Conn | asyncpg.Pool, workflow_ids: list[str],
                      marks: list[datetime]) -> list[asyncpg.Record]:
    return list(await conn.fetch(MOVED_SINCE, workflow_ids, marks))


async def contacts_for_emails(conn: Conn | asyncpg.Pool, *, tenant: str,
                              emails: list[str]) -> list[asyncpg.Record]:
    return list(await conn.fetch(CONTACTS_FOR_EMAILS, tenant, emails))
