"""The ramp of a first live run (docs/architecture.md §6, "Going live"): at most N
automatic follow-ups per clock hour (UTC) for a tenant, for the first days after it was
switched to live. The planner locks the hour's row with its facts (`matches.PLAN_FACTS`),
decides from the locked count (`planning.plan`) and records the slot or the hold with the
intent (`intents.PLAN_FOLLOWUP`), all in its transaction: a slot a rolled-back plan took is
given back with it, and a re-run of a plan reuses its intent instead of taking another.
`take_slot` is the same rule as one statement of its own."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import asyncpg

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# One slot of the hour, or none: the conditional upsert takes the hour row's lock, so two
# plans at the same instant are serialised by the row, never by a count read before a write.
# With a cap of 0 nothing is inserted and nothing is granted. $1 tenant, $2 the hourly cap.
TAKE_SLOT = """
INSERT INTO ramp_hours (tenant, hour_start, granted)
SELECT $1, date_trunc('hour', now()), 1 WHERE $2::int > 0
ON CONFLICT (tenant, hour_start) DO UPDATE SET granted = ramp_hours.granted + 1
WHERE ramp_hours.granted < $2::int
RETURNING granted
"""

RECORD_HOLD = """
INSERT INTO ramp_hours (tenant, hour_start, held) VALUES ($1, date_trunc('hour', now()), 1)
ON CONFLICT (tenant, hour_start) DO UPDATE SET held = ramp_hours.held + 1
"""

# Hours that granted or held something (the planner's facts lock an hour's row, creating it
# at 0 when it is the hour's first question: matches.PLAN_FACTS).
RAMP_HOURS = """
SELECT hour_start, granted, held FROM ramp_hours
WHERE tenant = $1 AND hour_start >= date_trunc('hour', $2::timestamptz)
  AND (granted > 0 OR held > 0)
ORDER BY hour_start
"""


async def take_slot(conn: Conn, tenant: str, per_hour: int) -> bool:
    """True: this follow-up may go out without a person. False: the hour is full (the
    hold is counted)."""
    if await conn.fetchval(TAKE_SLOT, tenant, per_hour) is not None:
        return True
    await conn.execute(RECORD_HOLD, tenant)
    return False


async def ramp_hours(conn: Conn, tenant: str, since: datetime) -> list[asyncpg.Record]:
    return list(await conn.fetch(RAMP_HOURS, tenant, since))
