"""Review notices (docs/architecture.md §6, "Going live"): which review waits a tenant's
reviewers have not heard about yet, claimed by one batch at a time.

The promise is kept by the key of `review_notices` — (task, wait, kind) — not by a read: a
batch claims its rows in the statement that finds them, posts, then marks them sent. Two
runs at once never claim the same notice. A claim whose batch never finished (a crashed
worker, an answer that never came) is taken over after the lease: that notice may then be
posted twice, never lost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

import asyncpg

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# Up to $3 notices of tenant $1 for batch $2: each open review wait not told yet (`new`), and
# each open one past its escalation time not told yet (`overdue`); claims older than $4
# seconds still `sending` are taken over. Returns what the message may say: references and
# reasons, never content.
CLAIM_NOTICES = """
WITH due AS (
    SELECT t.task_id, COALESCE(t.wait_id, '') AS wait_id, k.kind
    FROM review_tasks t
    CROSS JOIN (VALUES ('new'), ('overdue')) AS k (kind)
    WHERE t.tenant = $1 AND t.status = 'open'
      AND (k.kind = 'new' OR t.escalate_at <= now())
      AND NOT EXISTS (
          SELECT 1 FROM review_notices n
          WHERE n.task_id = t.task_id AND n.wait_id = COALESCE(t.wait_id, '')
            AND n.kind = k.kind
            AND (n.status = 'sent' OR n.claimed_at > now() - make_interval(secs => $4)))
    ORDER BY t.first_seen, k.kind
    LIMIT $3
), claimed AS (
    INSERT INTO review_notices (task_id, wait_id, kind, tenant, batch_id)
    SELECT task_id, wait_id, kind, $1, $2 FROM due
    ON CONFLICT (task_id, wait_id, kind) DO UPDATE
    SET batch_id = EXCLUDED.batch_id, claimed_at = now()
    WHERE review_notices.status = 'sending'
      AND review_notices.claimed_at <= now() - make_interval(secs => $4)
    RETURNING task_id, kind
)
SELECT c.kind, t.task_id, t.workflow_id, t.reason, t.owner, t.first_seen, t.escalate_at,
       e.state
FROM claimed c
JOIN review_tasks t ON t.task_id = c.task_id
JOIN inbound_events e ON e.event_id = t.event_id
ORDER BY c.kind, t.first_seen
"""

MARK_SENT = """
UPDATE review_notices SET status = 'sent', sent_at = now()
WHERE batch_id = $1 AND status = 'sending'
"""

# The webhook refused or was never reached: nothing went out, the next run tries again.
RELEASE = "DELETE FROM review_notices WHERE batch_id = $1 AND status = 'sending'"


async def claim(conn: Conn, tenant: str, batch_id: UUID, limit: int, lease_seconds: float
                ) -> list[asyncpg.Record]:
    return list(await conn.fetch(CLAIM_NOTICES, tenant, batch_id, limit, lease_seconds))


async def mark_sent(conn: Conn, batch_id: UUID) -> None:
    await conn.execute(MARK_SENT, batch_id)


async def release(conn: Conn, batch_id: UUID) -> None:
    await conn.execute(RELEASE, batch_id)
