"""upsert_contact_in_crm: one CRM side effect, keyed by the integration contact ID.

The CRM is called with our contact ID as its unique external ID, so a repeated request
updates the same record. After an uncertain attempt the record is looked up by that ID
first (read-after-write consistent, not the lagging search index).
"""

from __future__ import annotations

from typing import Any

import asyncpg
from temporalio import activity

from activities import store
from activities.adapters.base import ContactFields, CrmClient
from activities.outbox import Attempt, OutboxRunner
from schemas.models import Action, ItemState, OperationInput, OperationResult

LOAD_CONTACT = """
SELECT contact_id, email, name, company FROM contacts WHERE contact_id = $1::uuid
"""

SET_CRM_RECORD = """
UPDATE contacts SET crm_record_id = $2, updated_at = now() WHERE contact_id = $1::uuid
"""


class CrmActivities:
    def __init__(self, pool: asyncpg.Pool, crm: CrmClient, max_retry_after: float) -> None:
        self._pool = pool
        self._crm = crm
        self._runner = OutboxRunner(pool, action=Action.CRM_UPSERT.value, pause_scope="crm",
                                    max_retry_after=max_retry_after)

    @activity.defn(name="upsert_contact_in_crm")
    async def upsert_contact_in_crm(self, op: OperationInput) -> OperationResult:
        return await self._runner.run(
            op, reconcile=self._find, perform=self._upsert, record_success=self._record,
            running_state=ItemState.CRM_PENDING,
        )

    async def _find(self, attempt: Attempt) -> str | None:
        record = await self._crm.find_contact(_contact_id(attempt))
        return record.record_id if record else None

    async def _upsert(self, attempt: Attempt) -> str:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(LOAD_CONTACT, _contact_id(attempt))
        if row is None:
            raise LookupError("contact not found for operation")
        record = await self._crm.upsert_contact(
            str(row["contact_id"]),
            ContactFields(email=row["email"], name=row["name"], company=row["company"]),
        )
        return record.record_id

    async def _record(self, conn: Any, attempt: Attempt, record_id: str, reconciled: bool) -> None:
        item = attempt.op.item
        await conn.execute(SET_CRM_RECORD, _contact_id(attempt), record_id)
        await store.audit(
            conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
            contact_id=_contact_id(attempt), actor="crm", action="crm_upserted",
            detail={"op_key": attempt.op.op_key, "crm": self._crm.name,
                    "crm_record_id": record_id, "attempt": attempt.claim.attempts,
                    "reconciled": reconciled},
        )


def _contact_id(attempt: Attempt) -> str:
    ref = attempt.claim.external_ref
    if ref is None:
        raise LookupError("operation has no contact reference")
    return ref
