"""Changes made at the CRM behind the product's back, as a person in the CRM's UI would make
them, so tests can prove the drift check notices (control API, not a CRM route):

- `DELETE /_sandbox/contacts/{id}`: the contact is deleted, with the notes logged on it;
  404 when there is no such record.
- `PATCH /_sandbox/contacts/{id}` `{"properties": {...}}`: properties are overwritten (an
  empty string clears one). Changing the record's unique ID property changes the value the
  upsert and the lookup by that property see, as on HubSpot, where the property *is* the
  external ID.
- `DELETE /_sandbox/notes/{id}`: one note, Task or email activity is deleted, as a
  salesperson tidying a timeline would; 404 when there is no such activity.

Neither consumes faults nor appears in `/_sandbox/calls`: they are not the product's calls.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from inboxcrm.sandbox.core import SandboxDep, read_json
from inboxcrm.sandbox.crm import contact_json, not_found, validation_error

router = APIRouter(prefix="/_sandbox")

_PATCH = """
UPDATE sandbox.contacts
SET properties = properties || $2::jsonb,
    id_value = coalesce($2::jsonb ->> id_property, id_value),
    updated_at = clock_timestamp()
WHERE id = $1
RETURNING id, properties, created_at, updated_at
"""


def _record_id(raw: str) -> int | None:
    return int(raw) if raw.isdigit() and len(raw) < 19 else None


@router.delete("/contacts/{record_id}")
async def delete_contact(record_id: str, sandbox: SandboxDep) -> Response:
    found = _record_id(record_id)
    async with sandbox.pool.acquire() as conn, conn.transaction():
        await conn.execute("DELETE FROM sandbox.notes WHERE contact_id = $1", found)
        deleted = await conn.fetchval(
            "DELETE FROM sandbox.contacts WHERE id = $1 RETURNING id", found)
    if deleted is None:
        return not_found("Object not found.")
    return JSONResponse({"deleted": str(deleted)})


@router.patch("/contacts/{record_id}")
async def change_contact(request: Request, record_id: str, sandbox: SandboxDep) -> Response:
    body: Any = await read_json(request)
    properties = body.get("properties") if isinstance(body, dict) else None
    if not isinstance(properties, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items()):
        return validation_error("body must be {\"properties\": {name: string value}}")
    row = await sandbox.pool.fetchrow(_PATCH, _record_id(record_id), properties)
    if row is None:
        return not_found("Object not found.")
    return JSONResponse(contact_json(row))


@router.delete("/notes/{note_id}")
async def delete_note(note_id: str, sandbox: SandboxDep) -> Response:
    deleted = await sandbox.pool.fetchval(
        "DELETE FROM sandbox.notes WHERE id = $1 RETURNING id", _record_id(note_id))
    if deleted is None:
        return not_found("Object not found.")
    return JSONResponse({"deleted": str(deleted)})
