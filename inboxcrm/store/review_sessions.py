"""The `review_sessions` table (migration 069): the review desk's server-side sessions
(`inboxcrm/ingress/reviewer_auth.py`). A row per sign-in, keyed by the SHA-256 of the
session's random ID; ended by sign-out, refused past its expiry or its idle time."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

START_SESSION = """
INSERT INTO review_sessions (session_sha256, who, credential, expires_at)
VALUES ($1, $2, $3, now() + make_interval(secs => $4))
"""

# Sessions ended or expired a day ago are of no use to anyone: pruned at each sign-in.
PRUNE_SESSIONS = """
DELETE FROM review_sessions
WHERE coalesce(ended_at, expires_at) < now() - interval '1 day'
"""

# One statement checks and touches: live (not ended, not expired, seen within the idle
# time) and, if so, seen now.
TOUCH_SESSION = """
UPDATE review_sessions SET last_seen_at = now()
WHERE session_sha256 = $1 AND ended_at IS NULL AND expires_at > now()
  AND last_seen_at > now() - make_interval(secs => $2)
RETURNING who, credential
"""

END_SESSION = """
UPDATE review_sessions SET ended_at = now() WHERE session_sha256 = $1 AND ended_at IS NULL
"""


async def start_session(conn: Conn, *, session_sha256: bytes, who: str, credential: str,
                        seconds: float) -> None:
    await conn.execute(PRUNE_SESSIONS)
    await conn.execute(START_SESSION, session_sha256, who, credential, seconds)


async def touch_session(conn: Conn, *, session_sha256: bytes,
                        idle_seconds: float) -> tuple[str, str] | None:
    """(who, credential) of a live session, now seen; None if there is none."""
    row = await conn.fetchrow(TOUCH_SESSION, session_sha256, idle_seconds)
    return None if row is None else (str(row["who"]), str(row["credential"]))


async def end_session(conn: Conn, *, session_sha256: bytes) -> None:
    await conn.execute(END_SESSION, session_sha256)
