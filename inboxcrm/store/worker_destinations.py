"""What each running worker would call, per tenant (migration 079): written and refreshed by
the worker, read by `inboxcrm rehearse`'s guard. Providers and base URLs only."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import asyncpg

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# A worker reports this often; one not heard from for LIVE_SECONDS is gone (killed).
REPORT_SECONDS = 5.0
LIVE_SECONDS = 3 * REPORT_SECONDS

# $1 worker, $2 queue, $3 started, then one array per column (one element per tenant). The
# tenants no longer in its policies are dropped in the same statement.
REPORT = """
WITH reported AS (
    INSERT INTO worker_destinations (worker_id, tenant, task_queue, crm_provider, crm_url,
                                     mail_provider, mail_url, started_at, seen_at)
    SELECT $1, t.tenant, $2, t.crm_provider, t.crm_url, t.mail_provider, t.mail_url, $3, now()
    FROM unnest($4::text[], $5::text[], $6::text[], $7::text[], $8::text[])
         AS t(tenant, crm_provider, crm_url, mail_provider, mail_url)
    ON CONFLICT (worker_id, tenant) DO UPDATE
    SET task_queue = EXCLUDED.task_queue, crm_provider = EXCLUDED.crm_provider,
        crm_url = EXCLUDED.crm_url, mail_provider = EXCLUDED.mail_provider,
        mail_url = EXCLUDED.mail_url, seen_at = now()
    RETURNING tenant
)
DELETE FROM worker_destinations
WHERE worker_id = $1 AND NOT (tenant = ANY($4::text[]))
"""

FORGET = "DELETE FROM worker_destinations WHERE worker_id = $1"

# Rows older than a day are a killed worker's: dropped whenever someone reads.
LIVE = """
WITH dropped AS (
    DELETE FROM worker_destinations WHERE seen_at < now() - interval '1 day'
)
SELECT worker_id, task_queue, crm_provider, crm_url, mail_provider, mail_url, started_at,
       seen_at, extract(epoch FROM now() - seen_at)::float8 AS age_seconds
FROM worker_destinations
WHERE tenant = $1 AND seen_at >= now() - make_interval(secs => $2)
ORDER BY worker_id
"""


async def report(conn: Conn, *, worker_id: str, task_queue: str, started_at: datetime,
                 tenants: list[tuple[str, str, str, str, str]]) -> None:
    """This worker's destinations now: (tenant, crm provider, crm URL, mail provider, mail
    URL) per tenant it serves."""
    columns = list(zip(*tenants, strict=True)) if tenants else [(), (), (), (), ()]
    await conn.execute(REPORT, worker_id, task_queue, started_at,
                       *(list(column) for column in columns))


async def forget(conn: Conn, *, worker_id: str) -> None:
    """A worker stopping: it calls nothing any more."""
    await conn.execute(FORGET, worker_id)


async def live_for_tenant(conn: Conn, *, tenant: str, max_age_seconds: float
                          ) -> list[asyncpg.Record]:
    """The workers that reported the tenant's destinations within `max_age_seconds`."""
    return list(await conn.fetch(LIVE, tenant, max_age_seconds))
