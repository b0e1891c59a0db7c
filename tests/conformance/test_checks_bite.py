"""The conformance checks fail when the sandbox answers what the service would not: a note
upsert answer without `startedAt` does not parse with the SDK, and a sandbox whose keys never
expire fails the key-expiry check. A check that could not fail would prove nothing."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.helpers.conformance import check_idempotency_key_expires, parse_note_upsert_answer
from tests.helpers.sandbox_process import API_KEY, SandboxProcess


async def test_note_answer_without_started_at_fails_the_sdk(sandbox: SandboxProcess) -> None:
    key = str(uuid.uuid4())
    body = {"inputs": [{"idProperty": "inboxcrm_note_id", "id": key, "properties": {
        "hs_note_body": "x", "hs_timestamp": "2026-11-29T10:00:00.000Z"}}]}
    async with httpx.AsyncClient(base_url=sandbox.url,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as raw:
        answer = (await raw.post("/crm/v3/objects/notes/batch/upsert", json=body)).json()
    assert parse_note_upsert_answer(answer).results[0].properties["inboxcrm_note_id"] == key
    doctored = {k: v for k, v in answer.items() if k != "startedAt"}
    with pytest.raises(ValueError, match="started_at"):
        parse_note_upsert_answer(doctored)


async def test_keys_that_never_expire_fail_the_expiry_check(
        keys_never_expire: SandboxProcess) -> None:
    def advance(seconds: float) -> None:
        httpx.post(f"{keys_never_expire.url}/_sandbox/clock",
                   json={"advance_seconds": seconds}).raise_for_status()

    with pytest.raises(AssertionError, match="older than 24 h"):
        check_idempotency_key_expires(keys_never_expire.url, API_KEY, advance)
