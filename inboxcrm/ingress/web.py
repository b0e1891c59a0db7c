"""HTTP helpers shared by the relay's endpoints (inbound sources, codec, unsubscribe)."""

from __future__ import annotations

from fastapi import Request


async def read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None when it exceeds `limit` (checked before and while reading), so an
    oversized request is refused without being held in memory."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
