"""Provider request IDs in the ledger and the audit (issue 37, Evidence), on the real stack:
the sandbox answers every call with a request ID of its own (HubSpot's
`X-HubSpot-Correlation-Id` on its CRM paths, `X-Request-Id` on the mail API) and logs it with
the call. An item's CRM upsert and its follow-up each record the ID of the answer that
completed them in the operation's row (`operations.last_request_id`, migration 078) and in
the success's audit entry; a CRM upsert the sandbox refuses with 401 records the refusal's
ID in the row and in `attempt_failed`."""

from __future__ import annotations

import asyncpg

from inboxcrm.verify.probe import StackClient, message_from, unique_email

AUDIT = """SELECT action, detail FROM audit_log WHERE workflow_id = $1
           AND detail->>'op_key' = $2 ORDER BY audit_id"""


async def _ids_of(env: StackClient, target: str) -> set[str]:
    return {c["request_id"] for c in await env.calls(target) if c["request_id"]}


async def _audit(db: asyncpg.Pool, workflow_id: str, op_key: str) -> list[tuple[str, dict]]:
    return [(r["action"], r["detail"]) for r in await db.fetch(AUDIT, workflow_id, op_key)]


async def test_a_completed_operation_records_the_answer_s_request_id(
        env: StackClient, db: asyncpg.Pool) -> None:
    workflow_id = await env.deliver(message_from(unique_email("requestid")))
    assert await env.wait_state(workflow_id, "completed", timeout=90) == (
        "completed", "followup_sent")
    for action, target, audited in (("crm-upsert", "crm.upsert", "crm_upserted"),
                                    ("send", "mail.send", "followup_sent")):
        op_key = f"{workflow_id}:{action}"
        row = await env.operation(op_key)
        assert row is not None and row["status"] == "completed"
        request_id = (await db.fetchrow(
            "SELECT last_request_id FROM operations WHERE op_key = $1", op_key))[0]
        assert request_id and request_id.startswith("sbx-")
        assert request_id in await _ids_of(env, target), (action, request_id)
        entries = [d for a, d in await _audit(db, workflow_id, op_key) if a == audited]
        assert [d.get("request_id") for d in entries] == [request_id]


async def test_a_refused_attempt_records_the_refusal_s_request_id(
        env: StackClient, db: asyncpg.Pool) -> None:
    before = await _ids_of(env, "crm.upsert")
    await env.inject("crm.upsert", "unauthorized", count=1)
    workflow_id = await env.deliver(message_from(unique_email("requestid401")))
    _, reason = await env.wait_state(workflow_id, "blocked", timeout=90)
    assert str(reason).startswith("http_401")
    refused = [c for c in await env.calls("crm.upsert")
               if c["request_id"] not in before and c["outcome"] == "unauthorized"]
    assert len(refused) == 1
    op_key = f"{workflow_id}:crm-upsert"
    stored = await db.fetchval("SELECT last_request_id FROM operations WHERE op_key = $1",
                               op_key)
    assert stored == refused[0]["request_id"]
    failed = [d for a, d in await _audit(db, workflow_id, op_key) if a == "attempt_failed"]
    assert [d["request_id"] for d in failed] == [stored]
    await (await env.temporal()).get_workflow_handle(workflow_id).terminate("test done")
