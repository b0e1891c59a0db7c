"""HubSpot-compatible notes subset: batch upsert by a unique idProperty (fault target
`crm.note`), read by id or idProperty, and the v4 default association with a contact
(fault target `crm.association`). Email engagements: `POST /crm/v3/objects/emails` with
inline `associations` (fault target `crm.email`; a unique property value already held is a
409 CONFLICT, as HubSpot answers), read by id or idProperty.

As on HubSpot: a note needs `hs_timestamp` (when the activity happened: it places the note
on the contact's timeline); a batch-upsert input holds only `id`, `properties`, `idProperty`
and `objectWriteTraceId` (an `associations` field is rejected: associating is the v4 call,
`PUT /crm/v4/objects/notes/{noteId}/associations/default/contacts/{contactId}`, which is safe
to repeat); the upsert answer carries `startedAt`/`completedAt` and per result `new`; a read
with `?associations=contacts` answers `{"contacts": {"results": [{"id", "type"}]}}`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from inboxcrm.sandbox.core import Outcome, SandboxDep, crm_error, iso, now_iso, read_json

router = APIRouter(prefix="/crm/v3/objects/notes")
associations = APIRouter(prefix="/crm/v4/objects")

MAX_BATCH = 100
UPSERT_FIELDS = frozenset({"id", "properties", "idProperty", "objectWriteTraceId"})
NOTE_TO_CONTACT = 202  # HubSpot-defined association type IDs
CONTACT_TO_NOTE = 201

# Salesforce Task (sandbox.salesforce): the WhoId is a field of the task itself.
UPSERT_NOTE = """
INSERT INTO sandbox.notes (id_property, id_value, contact_id, body, kind, subject)
VALUES ($1, $2, $3, $4, 'task', $5)
ON CONFLICT (id_property, id_value) DO UPDATE
SET body = EXCLUDED.body, subject = EXCLUDED.subject, updated_at = clock_timestamp()
RETURNING id, id_value, contact_id, lead_id, body, subject, created_at, updated_at,
          (xmax = 0) AS created
"""

# A Salesforce Task whose WhoId is a Lead.
UPSERT_LEAD_NOTE = """
INSERT INTO sandbox.notes (id_property, id_value, lead_id, body, kind, subject)
VALUES ($1, $2, $3, $4, 'task', $5)
ON CONFLICT (id_property, id_value) DO UPDATE
SET body = EXCLUDED.body, subject = EXCLUDED.subject, updated_at = clock_timestamp()
RETURNING id, id_value, contact_id, lead_id, body, subject, created_at, updated_at,
          (xmax = 0) AS created
"""

# A HubSpot email engagement; NULL when its unique property value is held already.
CREATE_EMAIL = """
INSERT INTO sandbox.notes (id_property, id_value, body, hs_timestamp, kind, subject, direction)
VALUES ($1, $2, $3, $4, 'email', $5, $6)
ON CONFLICT (id_property, id_value) DO NOTHING
RETURNING id
"""
ASSOCIATE_CONTACT = """
INSERT INTO sandbox.note_contacts (note_id, contact_id) VALUES ($1, $2) ON CONFLICT DO NOTHING
"""
CONTACT_EXISTS = "SELECT EXISTS (SELECT 1 FROM sandbox.contacts WHERE id = $1)"
EMAIL_TO_CONTACT = 198

GET_NOTE = """
SELECT id, id_value, contact_id, lead_id, body, subject, created_at, updated_at
FROM sandbox.notes
WHERE id_property = $1 AND id_value = $2
"""

UPSERT_HUBSPOT_NOTE = """
INSERT INTO sandbox.notes AS n (id_property, id_value, body, hs_timestamp)
VALUES ($1, $2, $3, $4)
ON CONFLICT (id_property, id_value) DO UPDATE
SET body = EXCLUDED.body, hs_timestamp = EXCLUDED.hs_timestamp, updated_at = clock_timestamp()
RETURNING n.id, (n.xmax = 0) AS created
"""

# A note with every contact it is associated with (a Task's WhoId counts as one).
def lead_id(number: int) -> str:
    """A Lead's Id: Salesforce's Lead key prefix `00Q`, then the sandbox's number."""
    return f"00Q{number:012d}"


SELECT_NOTES = """
SELECT n.id, n.id_property, n.id_value, n.body, n.hs_timestamp, n.created_at, n.updated_at,
       n.kind, n.subject, n.direction, n.lead_id,
       ARRAY(SELECT n.contact_id WHERE n.contact_id IS NOT NULL
             UNION SELECT a.contact_id FROM sandbox.note_contacts a WHERE a.note_id = n.id
             ORDER BY 1) AS contacts
FROM sandbox.notes n
"""

ASSOCIATE = """
INSERT INTO sandbox.note_contacts (note_id, contact_id)
SELECT n.id, c.id FROM sandbox.notes n, sandbox.contacts c WHERE n.id = $1 AND c.id = $2
ON CONFLICT DO NOTHING
RETURNING note_id
"""

EXISTS_BOTH = """
SELECT EXISTS (SELECT 1 FROM sandbox.notes WHERE id = $1)
   AND EXISTS (SELECT 1 FROM sandbox.contacts WHERE id = $2)
"""


def state_json(row: asyncpg.Record) -> dict[str, Any]:
    """A note as `/_sandbox/state` lists it: associated contacts as a list of record IDs."""
    return {
        "id": str(row["id"]),
        "properties": {"hs_note_body": row["body"], "hs_timestamp": row["hs_timestamp"],
                       row["id_property"]: row["id_value"]},
        "associations": {"contacts": [str(c) for c in row["contacts"]]},
        "createdAt": iso(row["created_at"]),
        "updatedAt": iso(row["updated_at"]),
    }


def activity_json(row: asyncpg.Record) -> dict[str, Any]:
    """An activity as `/_sandbox/state` lists it: what it is (`note`, `email`, `task`), the
    surface it was logged through, its words, and the records (contacts; a Salesforce Task's
    Lead) it belongs to."""
    return {
        "id": str(row["id"]), "type": row["kind"],
        "crm": "salesforce" if row["kind"] == "task" else "hubspot",
        "subject": row["subject"], "text": row["body"], "direction": row["direction"],
        "timestamp": row["hs_timestamp"], "key": {row["id_property"]: row["id_value"]},
        "records": [str(c) for c in row["contacts"]]
        + ([lead_id(row["lead_id"])] if row["lead_id"] is not None else []),
        "createdAt": iso(row["created_at"]),
    }


def email_json(row: asyncpg.Record) -> dict[str, Any]:
    """An email engagement as HubSpot's API answers it (`SimplePublicObject`)."""
    return {
        "id": str(row["id"]),
        "properties": {
            "hs_email_subject": row["subject"], "hs_email_text": row["body"],
            "hs_email_direction": row["direction"], "hs_timestamp": row["hs_timestamp"],
            row["id_property"]: row["id_value"], "hs_object_id": str(row["id"]),
            "hs_createdate": iso(row["created_at"]),
            "hs_lastmodifieddate": iso(row["updated_at"]),
        },
        "createdAt": iso(row["created_at"]),
        "updatedAt": iso(row["updated_at"]),
        "archived": False,
    }


def note_json(row: asyncpg.Record, with_associations: bool = False) -> dict[str, Any]:
    """A note as HubSpot's API answers it (`SimplePublicObject[WithAssociations]`)."""
    body: dict[str, Any] = {
        "id": str(row["id"]),
        "properties": {
            "hs_note_body": row["body"],
            "hs_timestamp": row["hs_timestamp"],
            row["id_property"]: row["id_value"],
            "hs_object_id": str(row["id"]),
            "hs_createdate": iso(row["created_at"]),
            "hs_lastmodifieddate": iso(row["updated_at"]),
        },
        "createdAt": iso(row["created_at"]),
        "updatedAt": iso(row["updated_at"]),
        "archived": False,
    }
    if with_associations and row["contacts"]:
        body["associations"] = {"contacts": {"results": [
            {"id": str(c), "type": "note_to_contact"} for c in row["contacts"]]}}
    return body


def _timestamp(value: Any) -> str | None:
    """hs_timestamp as HubSpot accepts it: epoch milliseconds or an ISO 8601 date-time."""
    text = str(value).strip() if isinstance(value, str | int) else ""
    if text.isdigit():
        return iso(datetime.fromtimestamp(int(text) / 1000, UTC))
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return iso(parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC))


def _parse(body: Any) -> list[tuple[str, str, str, str]] | str:
    """(idProperty, id, body, hs_timestamp) per input, or what is wrong."""
    inputs = body.get("inputs") if isinstance(body, dict) else None
    if not isinstance(inputs, list) or not inputs or len(inputs) > MAX_BATCH:
        return f"'inputs' must hold 1 to {MAX_BATCH} notes."
    parsed = []
    for n, item in enumerate(inputs):
        if not isinstance(item, dict):
            return f"inputs[{n}] must be an object."
        unknown = sorted(set(item) - UPSERT_FIELDS)
        if unknown:
            return f'Invalid input JSON: Unrecognized field "{unknown[0]}" in inputs[{n}].'
        id_property, id_value = item.get("idProperty"), item.get("id")
        properties = item.get("properties")
        if not isinstance(id_property, str) or not isinstance(id_value, str) or not id_value:
            return f"inputs[{n}]: idProperty and id are required."
        if not isinstance(properties, dict):
            return f"inputs[{n}].properties must be an object."
        text = properties.get("hs_note_body")
        if not isinstance(text, str) or not text:
            return f"inputs[{n}].properties.hs_note_body is required."
        if "hs_timestamp" not in properties:
            return f"inputs[{n}]: Property values were not valid: hs_timestamp is required."
        stamp = _timestamp(properties["hs_timestamp"])
        if stamp is None:
            return f"inputs[{n}]: hs_timestamp must be epoch milliseconds or ISO 8601."
        if properties.get(id_property, id_value) != id_value:
            return f"inputs[{n}].properties.{id_property} differs from inputs[{n}].id."
        parsed.append((id_property, id_value, text, stamp))
    return parsed


@router.post("/batch/upsert")
async def upsert_note(request: Request, sandbox: SandboxDep) -> Response:
    """Create or update notes keyed by a unique idProperty. No association here."""

    async def operation() -> Outcome:
        started = now_iso()
        parsed = _parse(await read_json(request))
        if isinstance(parsed, str):
            return Outcome(crm_error(400, "VALIDATION_ERROR", parsed), "invalid")
        results = []
        async with sandbox.pool.acquire() as conn, conn.transaction():
            for id_property, id_value, text, stamp in parsed:
                row = await conn.fetchrow(UPSERT_HUBSPOT_NOTE, id_property, id_value, text, stamp)
                assert row is not None
                note = await conn.fetchrow(f"{SELECT_NOTES} WHERE n.id = $1", row["id"])
                assert note is not None
                results.append({**note_json(note), "new": row["created"]})
        body = {"status": "COMPLETE", "results": results, "startedAt": started,
                "completedAt": now_iso()}
        return Outcome(JSONResponse(body))

    return await sandbox.run(request, "crm.note", operation)


@router.get("/{value}")
async def get_note(value: str, request: Request, sandbox: SandboxDep,
                   idProperty: str | None = None,  # noqa: N803
                   associations: str | None = None) -> Response:
    """Read a note by id, or by a unique property; read-after-write, no lag."""

    async def operation() -> Outcome:
        row = None
        if idProperty in (None, "", "hs_object_id"):
            if value.isdigit() and len(value) < 19:
                row = await sandbox.pool.fetchrow(f"{SELECT_NOTES} WHERE n.id = $1", int(value))
        else:
            row = await sandbox.pool.fetchrow(
                f"{SELECT_NOTES} WHERE n.id_property = $1 AND n.id_value = $2", idProperty, value)
        if row is None:
            return Outcome(crm_error(404, "OBJECT_NOT_FOUND", "Object not found."), "not_found")
        wanted = {a.strip() for a in (associations or "").split(",")}
        return Outcome(JSONResponse(note_json(row, "contacts" in wanted)))

    return await sandbox.run(request, "crm.search", operation)


def _spec(type_id: int) -> dict[str, Any]:
    return {"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": type_id}


@associations.put("/{from_type}/{from_id}/associations/default/{to_type}/{to_id}")
async def associate_default(from_type: str, from_id: str, to_type: str, to_id: str,
                            request: Request, sandbox: SandboxDep) -> Response:
    """The default (unlabelled) association between a note and a contact, either direction.
    Repeating it changes nothing; both directions are answered, as HubSpot does."""

    async def operation() -> Outcome:
        started = now_iso()
        pair = (from_type.lower(), to_type.lower())
        if pair not in (("notes", "contacts"), ("contacts", "notes")):
            return Outcome(crm_error(400, "VALIDATION_ERROR",
                                     f"No default association from {from_type} to {to_type}."),
                           "invalid")
        if not (from_id.isdigit() and to_id.isdigit() and max(len(from_id), len(to_id)) < 19):
            return Outcome(crm_error(404, "OBJECT_NOT_FOUND", "Object not found."), "not_found")
        note, contact = ((int(from_id), int(to_id)) if pair[0] == "notes"
                         else (int(to_id), int(from_id)))
        async with sandbox.pool.acquire() as conn:
            await conn.fetchval(ASSOCIATE, note, contact)
            exists = await conn.fetchval(EXISTS_BOTH, note, contact)
        if not exists:
            return Outcome(crm_error(404, "OBJECT_NOT_FOUND", "Object not found."), "not_found")
        results = [
            {"from": {"id": str(note)}, "to": {"id": str(contact)},
             "associationSpec": _spec(NOTE_TO_CONTACT)},
            {"from": {"id": str(contact)}, "to": {"id": str(note)},
             "associationSpec": _spec(CONTACT_TO_NOTE)},
        ]
        body = {"status": "COMPLETE", "results": results, "startedAt": started,
                "completedAt": now_iso()}
        return Outcome(JSONResponse(body))

    return await sandbox.run(request, "crm.association", operation)


# --- email engagements (https://developers.hubspot.com/docs/api-reference/crm-emails-v3) --
emails = APIRouter(prefix="/crm/v3/objects/emails")
EMAIL_FIELDS = frozenset({"properties", "associations", "objectWriteTraceId"})
DIRECTIONS = frozenset({"INCOMING_EMAIL", "EMAIL", "FORWARDED_EMAIL"})
# The properties a unique value may be given in: the sandbox's registered id properties.
UNIQUE_PROPERTY = "inboxcrm_email_id"


def _parse_email(body: Any) -> tuple[dict[str, Any], list[int]] | str:
    """(properties, contact IDs to associate), or what is wrong."""
    if not isinstance(body, dict):
        return "Invalid input JSON: the body must be an object."
    unknown = sorted(set(body) - EMAIL_FIELDS)
    if unknown:
        return f'Invalid input JSON: Unrecognized field "{unknown[0]}".'
    properties = body.get("properties")
    if not isinstance(properties, dict):
        return "properties must be an object."
    if "hs_timestamp" not in properties or _timestamp(properties["hs_timestamp"]) is None:
        return "Property values were not valid: hs_timestamp is required."
    if properties.get("hs_email_direction", "EMAIL") not in DIRECTIONS:
        return "Property values were not valid: hs_email_direction."
    contacts: list[int] = []
    for n, association in enumerate(body.get("associations") or []):
        to = association.get("to") if isinstance(association, dict) else None
        types = association.get("types") if isinstance(association, dict) else None
        target = to.get("id") if isinstance(to, dict) else None
        if not isinstance(target, str | int) or not str(target).isdigit() or not types:
            return f"associations[{n}] needs to.id and types."
        if not any(isinstance(t, dict) and t.get("associationTypeId") == EMAIL_TO_CONTACT
                   for t in types):
            return f"associations[{n}]: only email_to_contact ({EMAIL_TO_CONTACT}) is offered."
        contacts.append(int(target))
    return properties, contacts


@emails.post("")
async def create_email(request: Request, sandbox: SandboxDep) -> Response:
    """Create an email engagement with its associations, in one transaction (as HubSpot's
    create with `associations`). A unique property value already held: 409, nothing new."""

    async def operation() -> Outcome:
        parsed = _parse_email(await read_json(request))
        if isinstance(parsed, str):
            return Outcome(crm_error(400, "VALIDATION_ERROR", parsed), "invalid")
        properties, contacts = parsed
        key = properties.get(UNIQUE_PROPERTY)
        id_property, id_value = ((UNIQUE_PROPERTY, str(key)) if key
                                 else ("hs_object_id", f"auto-{uuid.uuid4().hex}"))
        async with sandbox.pool.acquire() as conn, conn.transaction():
            for contact in contacts:
                if not await conn.fetchval(CONTACT_EXISTS, contact):
                    return Outcome(crm_error(400, "VALIDATION_ERROR",
                                             f"No contact with ID {contact}."), "invalid")
            new_id = await conn.fetchval(
                CREATE_EMAIL, id_property, id_value, str(properties.get("hs_email_text") or ""),
                _timestamp(properties["hs_timestamp"]),
                str(properties.get("hs_email_subject") or ""),
                str(properties.get("hs_email_direction") or "EMAIL"))
            if new_id is None:
                return Outcome(crm_error(
                    409, "CONFLICT", f"A email already has that value for {id_property}."),
                    "conflict")
            for contact in contacts:
                await conn.execute(ASSOCIATE_CONTACT, new_id, contact)
            row = await conn.fetchrow(f"{SELECT_NOTES} WHERE n.id = $1", new_id)
        assert row is not None
        return Outcome(JSONResponse(email_json(row), status_code=201))

    return await sandbox.run(request, "crm.email", operation)


@emails.get("/{value}")
async def get_email(value: str, request: Request, sandbox: SandboxDep,
                    idProperty: str | None = None) -> Response:  # noqa: N803
    """Read an email engagement by id, or by a unique property; read-after-write."""

    async def operation() -> Outcome:
        row = None
        if idProperty in (None, "", "hs_object_id"):
            if value.isdigit() and len(value) < 19:
                row = await sandbox.pool.fetchrow(
                    f"{SELECT_NOTES} WHERE n.id = $1 AND n.kind = 'email'", int(value))
        else:
            row = await sandbox.pool.fetchrow(
                f"{SELECT_NOTES} WHERE n.id_property = $1 AND n.id_value = $2 "
                "AND n.kind = 'email'", idProperty, value)
        if row is None:
            return Outcome(crm_error(404, "OBJECT_NOT_FOUND", "Object not found."), "not_found")
        return Outcome(JSONResponse(email_json(row)))

    return await sandbox.run(request, "crm.search", operation)
