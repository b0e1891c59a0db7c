"""The `webhook_replay_tokens` table: a signed inbound request's token is accepted once
(Mailgun's replay protection, inboxcrm/ingress/sources/mailgun.py)."""

from __future__ import annotations

import asyncpg

CONSUME_TOKEN = """
INSERT INTO webhook_replay_tokens (source, token, signed_at)
VALUES ($1, $2, to_timestamp($3))
ON CONFLICT (source, token) DO NOTHING
RETURNING true
"""

PRUNE_TOKENS = """
DELETE FROM webhook_replay_tokens
WHERE source = $1 AND signed_at < now() - make_interval(secs => $2)
"""

RELEASE_TOKEN = "DELETE FROM webhook_replay_tokens WHERE source = $1 AND token = $2"


async def consume_token(pool: asyncpg.Pool, source: str, token: str, signed_at: int,
                        keep_seconds: float) -> bool:
    """True the first time a token is seen. Tokens older than `keep_seconds` are pruned:
    their timestamps are outside the tolerance window, so they are rejected anyway."""
    async with pool.acquire() as conn:
        await conn.execute(PRUNE_TOKENS, source, keep_seconds)
        return bool(await conn.fetchval(CONSUME_TOKEN, source, token, float(signed_at)))


async def release_token(pool: asyncpg.Pool, source: str, token: str) -> None:
    """Forget a token whose request was not stored, so the provider's retry is accepted."""
    await pool.execute(RELEASE_TOKEN, source, token)
