"""The `step_attempts` table: durable attempt counts for the steps outside the ledger
(extraction, planning); see inboxcrm/activities/step_attempts.py for why."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncpg

BEGIN_STEP = """
INSERT INTO step_attempts (workflow_id, step, started) VALUES ($1, $2, 1)
ON CONFLICT (workflow_id, step)
DO UPDATE SET started = step_attempts.started + 1, last_started = now()
RETURNING started
"""

END_STEP = "UPDATE step_attempts SET started = 0 WHERE workflow_id = $1 AND step = $2"


def begin_step_cte(workflow_id: str, step: str) -> str:
    """BEGIN_STEP as a CTE named `counted` (its `started`), for a step whose first statement
    commits on its own: the count then costs no round trip of its own. The arguments are
    the statement's parameter placeholders (e.g. "$3")."""
    return (f"counted AS (INSERT INTO step_attempts (workflow_id, step, started) "
            f"VALUES ({workflow_id}, {step}, 1) ON CONFLICT (workflow_id, step) "
            f"DO UPDATE SET started = step_attempts.started + 1, last_started = now() "
            f"RETURNING started)")


def end_step_cte(workflow_id: str, step: str) -> str:
    """END_STEP as a CTE named `cleared`, for the statement that records the step's result:
    the count is cleared atomically with it."""
    return (f"cleared AS (UPDATE step_attempts SET started = 0 "
            f"WHERE workflow_id = {workflow_id} AND step = {step})")


async def begin_step(pool: asyncpg.Pool, workflow_id: str, step: str) -> int:
    """Count one more started attempt of `step`; returns how many have started unended."""
    return int(await pool.fetchval(BEGIN_STEP, workflow_id, step))


async def end_step(pool: asyncpg.Pool, workflow_id: str, step: str) -> None:
    """The attempt ended (or a fresh count starts): the count goes back to zero."""
    await pool.execute(END_STEP, workflow_id, step)
