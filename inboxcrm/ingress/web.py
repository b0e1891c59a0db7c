"""HTTP helpers shared by the relay's endpoints (inbound sources, codec, unsubscribe)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request


async def read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None when it exceeds `limit` (checked before and while reading), so an
    oversized request is refused without being held in memory."""
    return await read_stream(request.headers.get("content-length"), request.stream(), limit)


async def read_stream(declared: str | None, chunks: AsyncIterator[bytes],
                      limit: int) -> bytes | None:
    """`read_body` over a declared Content-Length and the body's chunks."""
    if declared and declared.isdigit() and int(declared) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)
