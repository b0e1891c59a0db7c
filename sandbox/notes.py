"""HubSpot-compatible notes subset: a note logged on a contact, upserted by a unique
idProperty (fault target `crm.note`). Read-after-write consistent get by idProperty."""

from __future__ import annotations

from typing import Any

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sandbox.core import Outcome, SandboxDep, crm_error, iso, now_iso, read_json

router = APIRouter(prefix="/crm/v3/objects/notes")

UPSERT_NOTE = """
INSERT INTO sandbox.notes (id_property, id_value, contact_id, body)
VALUES ($1, $2, $3, $4)
ON CONFLICT (id_property, id_value) DO UPDATE
SET body = EXCLUDED.body, updated_at = clock_timestamp()
RETURNING id, id_value, contact_id, body, created_at, updated_at, (xmax = 0) AS created
"""

GET_NOTE = """
SELECT id, id_value, contact_id, body, created_at, updated_at FROM sandbox.notes
WHERE id_property = $1 AND id_value = $2
"""


def note_json(row: asyncpg.Record, id_property: str = "inboxcrm_note_id") -> dict[str, Any]:
    return {
        "id": str(row["id"]),
        "properties": {"hs_note_body": row["body"], id_property: row["id_value"]},
        "associations": {"contacts": [str(row["contact_id"])]},
        "createdAt": iso(row["created_at"]),
        "updatedAt": iso(row["updated_at"]),
    }


def _parse(body: Any) -> tuple[str, str, int, str] | str:
    inputs = body.get("inputs") if isinstance(body, dict) else None
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        return "'inputs' must hold exactly one note."
    item = inputs[0]
    id_property, id_value = item.get("idProperty"), item.get("id")
    text = (item.get("properties") or {}).get("hs_note_body")
    if not isinstance(id_property, str) or not isinstance(id_value, str) or not id_value:
        return "idProperty and id are required."
    if not isinstance(text, str) or not text:
        return "properties.hs_note_body is required."
    try:
        contact = int(item["associations"][0]["to"]["id"])
    except (KeyError, IndexError, TypeError, ValueError):
        return "associations[0].to.id must name the contact."
    return id_property, id_value, contact, text


@router.post("/batch/upsert")
async def upsert_note(request: Request, sandbox: SandboxDep) -> Response:
    """Log a note on a contact, keyed by a unique idProperty."""

    async def operation() -> Outcome:
        parsed = _parse(await read_json(request))
        if isinstance(parsed, str):
            return Outcome(crm_error(400, "VALIDATION_ERROR", parsed), "invalid")
        id_property, id_value, contact, text = parsed
        try:
            row = await sandbox.pool.fetchrow(UPSERT_NOTE, id_property, id_value, contact, text)
        except asyncpg.ForeignKeyViolationError:
            return Outcome(crm_error(404, "OBJECT_NOT_FOUND", "Contact not found."),
                           "not_found")
        assert row is not None
        body = {"status": "COMPLETE", "results": [{**note_json(row, id_property),
                                                    "new": row["created"]}],
                "completedAt": now_iso()}
        return Outcome(JSONResponse(body))

    return await sandbox.run(request, "crm.note", operation)


@router.get("/{value}")
async def get_note(value: str, request: Request, sandbox: SandboxDep,
                   idProperty: str = "inboxcrm_note_id") -> Response:  # noqa: N803
    async def operation() -> Outcome:
        row = await sandbox.pool.fetchrow(GET_NOTE, idProperty, value)
        if row is None:
            return Outcome(crm_error(404, "OBJECT_NOT_FOUND", "Note not found."), "not_found")
        return Outcome(JSONResponse(note_json(row, idProperty)))

    return await sandbox.run(request, "crm.search", operation)
