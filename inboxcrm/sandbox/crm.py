"""HubSpot-compatible contacts subset: batch upsert by unique idProperty, search, get, and
update by record ID (`PATCH /crm/v3/objects/contacts/{id}`: how an adapter writes its unique
property onto a contact a salesperson created).

Upsert identity is a unique constraint and email uniqueness is a unique index, so the
database, not a read-then-write, decides between "new" and "existing". Search only sees
records whose last write is older than the configured lag, like a real search index.
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass
from typing import Any

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from inboxcrm.sandbox import merges
from inboxcrm.sandbox.core import (
    Outcome,
    SandboxDep,
    crm_error,
    field_modes,
    iso,
    now_iso,
    read_json,
)

router = APIRouter(prefix="/crm/v3/objects/contacts")
# The communication preferences API (v4): how HubSpot's `hs_email_optout` is set.
preferences = APIRouter(prefix="/communication-preferences/v4")
# Property definitions (`crm check` reads `hasUniqueValue`).
properties = APIRouter(prefix="/crm/v3/properties")

MAX_BATCH = 100
UPSERT_ATTEMPTS = 10
MAX_SEARCH_LIMIT = 200
# Properties the sandbox cannot use as an upsert idProperty (not custom unique properties).
RESERVED_ID_PROPERTIES = frozenset({"email", "hs_object_id"})
# The fields of HubSpot's batch-upsert input (SimplePublicObjectBatchInputUpsert); any other
# field (e.g. `associations`) is rejected.
UPSERT_FIELDS = frozenset({"id", "properties", "idProperty", "objectWriteTraceId"})
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# Calculated by HubSpot ("Unsubscribed from all email"): no contact write may set it.
READ_ONLY_PROPERTIES = frozenset({"hs_email_optout"})


def read_only_error(name: str) -> JSONResponse:
    """HubSpot's refusal of a write to a read-only property (`READ_ONLY_VALUE`)."""
    return crm_error(400, "VALIDATION_ERROR",
                     f'Property values were not valid: "{name}" is a read only property; '
                     "its value cannot be set.",
                     errors=[{"message": f"{name} is a read only property",
                              "code": "READ_ONLY_VALUE", "context": {"propertyName": [name]}}])


def validation_error(message: str) -> JSONResponse:
    return crm_error(400, "VALIDATION_ERROR", message)


def not_found(message: str) -> JSONResponse:
    return crm_error(404, "OBJECT_NOT_FOUND", message)


def contact_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": str(row["id"]),
        "properties": row["properties"],
        "createdAt": iso(row["created_at"]),
        "updatedAt": iso(row["updated_at"]),
        "archived": False,
    }


def _as_text(value: Any) -> str:
    """HubSpot stores every property value as a string."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- batch upsert ---------------------------------------------------------------------


@dataclass(frozen=True)
class UpsertInput:
    id_property: str
    id_value: str
    properties: dict[str, str]

    @property
    def email(self) -> str:
        return self.properties.get("email", "").lower()


def parse_upsert(body: Any) -> list[UpsertInput] | str:
    """Validated inputs, or a message saying what is wrong."""
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        return "Request body must be a JSON object with an 'inputs' array."
    raw_inputs = body["inputs"]
    if not raw_inputs:
        return "'inputs' must not be empty."
    if len(raw_inputs) > MAX_BATCH:
        return f"At most {MAX_BATCH} inputs per batch."
    inputs: list[UpsertInput] = []
    for n, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict):
            return f"inputs[{n}] must be an object."
        unknown = sorted(set(raw) - UPSERT_FIELDS)
        if unknown:
            return f'Invalid input JSON: Unrecognized field "{unknown[0]}" in inputs[{n}].'
        id_property, id_value = raw.get("idProperty"), raw.get("id")
        if not isinstance(id_property, str) or not id_property:
            return f"inputs[{n}].idProperty is required."
        if id_property in RESERVED_ID_PROPERTIES:
            return f"inputs[{n}].idProperty must be a custom unique property."
        if isinstance(id_value, int) and not isinstance(id_value, bool):
            id_value = str(id_value)
        if not isinstance(id_value, str) or not id_value:
            return f"inputs[{n}].id is required."
        props = raw.get("properties", {})
        if not isinstance(props, dict):
            return f"inputs[{n}].properties must be an object."
        if any(not isinstance(v, str | int | float | bool | None) for v in props.values()):
            return f"inputs[{n}].properties values must be scalars."
        properties = {str(k): _as_text(v) for k, v in props.items()}
        if READ_ONLY_PROPERTIES & set(properties):
            return (f"Property values were not valid: inputs[{n}].properties."
                    f"{sorted(READ_ONLY_PROPERTIES & set(properties))[0]} is read only.")
        if properties.get(id_property, id_value) != id_value:
            return f"inputs[{n}].properties.{id_property} differs from inputs[{n}].id."
        properties[id_property] = id_value
        email = properties.get("email", "")
        if email and not _EMAIL.match(email):
            return f"Property values were not valid: inputs[{n}].properties.email is invalid."
        inputs.append(UpsertInput(id_property, id_value, properties))
    keys = [(i.id_property, i.id_value) for i in inputs]
    if len(set(keys)) != len(keys):
        return "Duplicate id in batch inputs."
    emails = [i.email for i in inputs if i.email]
    if len(set(emails)) != len(emails):
        return "Duplicate email in batch inputs."
    return inputs


_UPSERT = """
INSERT INTO sandbox.contacts AS c (id_property, id_value, properties)
VALUES ($1, $2, $3::jsonb)
ON CONFLICT (id_property, id_value) DO UPDATE
SET properties = c.properties || EXCLUDED.properties,
    updated_at = clock_timestamp()
RETURNING c.id, c.properties, c.created_at, c.updated_at, (c.xmax = 0) AS created
"""

_OWNER_OF_EMAIL = """
SELECT id, id_property, id_value FROM sandbox.contacts WHERE email_lower = $1 AND NOT email_dup
"""

# An upsert's idProperty is a unique property of the account from then on (as if created).
REGISTER_ID_PROPERTIES = """
INSERT INTO sandbox.id_properties (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING
"""


async def upsert(pool: asyncpg.Pool, inputs: list[UpsertInput]) -> Outcome:
    """All inputs in one transaction; an email owned by another record aborts the batch.

    Concurrent identical upserts can race inside Postgres' speculative insertion: the
    loser gets a unique violation on the (non-arbiter) email index, or a deadlock. Both
    roll back entirely, and the retry sees the winner's committed row and takes the
    ON CONFLICT update path. A violation whose owner has another id is a real conflict.
    """
    started = now_iso()
    for attempt in range(UPSERT_ATTEMPTS):
        current: UpsertInput | None = None
        try:
            async with pool.acquire() as conn, conn.transaction():
                rows: list[asyncpg.Record] = []
                for item in inputs:
                    current = item
                    row = await conn.fetchrow(
                        _UPSERT, item.id_property, item.id_value, item.properties
                    )
                    if row is None:
                        raise RuntimeError("INSERT ... RETURNING returned no row")
                    rows.append(row)
        except asyncpg.DeadlockDetectedError:
            await asyncio.sleep(random.uniform(0, 0.01 * (attempt + 1)))
            continue
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != "contacts_email_key" or current is None:
                raise
            owner = await pool.fetchrow(_OWNER_OF_EMAIL, current.email)
            if owner is None or (owner["id_property"], owner["id_value"]) == (
                current.id_property,
                current.id_value,
            ):
                continue
            existing = str(owner["id"])
            response = crm_error(
                409,
                "CONFLICT",
                f"Contact already exists. Existing ID: {existing}",
                context={"id": [existing]},
            )
            return Outcome(response, "conflict")
        results = [{**contact_json(row), "new": row["created"]} for row in rows]
        body = {
            "status": "COMPLETE",
            "results": results,
            "startedAt": started,
            "completedAt": now_iso(),
        }
        return Outcome(JSONResponse(body))
    raise RuntimeError("upsert kept losing races; giving up")


@router.post("/batch/upsert")
async def batch_upsert(request: Request, sandbox: SandboxDep) -> Response:
    """Create or update contacts keyed by a unique idProperty."""

    async def operation() -> Outcome:
        parsed = parse_upsert(await read_json(request))
        if isinstance(parsed, str):
            return Outcome(validation_error(parsed), "invalid")
        await sandbox.pool.execute(REGISTER_ID_PROPERTIES,
                                   sorted({i.id_property for i in parsed}))
        return await upsert(sandbox.pool, parsed)

    return await sandbox.run(request, "crm.upsert", operation)


# --- search ---------------------------------------------------------------------------


def _filter_sql(flt: Any, args: list[Any]) -> str | None:
    """SQL for one HubSpot filter with its values appended to `args`; None if invalid."""
    if not isinstance(flt, dict) or not isinstance(flt.get("propertyName"), str):
        return None
    name, operator = flt["propertyName"], flt.get("operator", "EQ")

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    if name in ("hs_object_id", "id"):
        column = "c.id::text"
    elif name == "email":
        column = "c.email_lower"
    else:
        column = f"(c.properties ->> {arg(name)})"
    if operator in ("HAS_PROPERTY", "NOT_HAS_PROPERTY"):
        test = f"coalesce({column}, '') <> ''"
        return test if operator == "HAS_PROPERTY" else f"NOT ({test})"

    def fold(value: Any) -> str:
        text = _as_text(value)
        return text.lower() if name == "email" else text

    if operator in ("EQ", "NEQ"):
        if "value" not in flt:
            return None
        value = fold(flt["value"])
        if operator == "EQ":
            return f"{column} = {arg(value)}"
        return f"{column} IS DISTINCT FROM {arg(value)}"
    if operator in ("IN", "NOT_IN"):
        values = flt.get("values")
        if not isinstance(values, list):
            return None
        texts = [fold(v) for v in values]
        test = f"{column} = ANY({arg(texts)}::text[])"
        return test if operator == "IN" else f"NOT coalesce({test}, false)"
    return None


def build_search(body: Any, lag_seconds: float) -> tuple[str, str, list[Any], int, int] | str:
    """(count SQL, page SQL, args, limit, offset) for a search body, or an error message."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        return "Request body must be a JSON object."
    groups = body.get("filterGroups", [])
    limit, after = body.get("limit", 10), body.get("after", 0)
    if not isinstance(groups, list):
        return "filterGroups must be an array."
    if not isinstance(limit, int) or not 1 <= limit <= MAX_SEARCH_LIMIT:
        return f"limit must be an integer between 1 and {MAX_SEARCH_LIMIT}."
    try:
        offset = int(after or 0)
    except (TypeError, ValueError):
        return "after must be a paging cursor."
    args: list[Any] = [lag_seconds]
    ors: list[str] = []
    for group in groups:
        filters = group.get("filters") if isinstance(group, dict) else None
        if not isinstance(filters, list) or not filters:
            return "Each filterGroup needs a non-empty 'filters' array."
        ands = [_filter_sql(flt, args) for flt in filters]
        if any(sql is None for sql in ands):
            return "Invalid filter: needs propertyName, a supported operator and its value."
        ors.append("(" + " AND ".join(str(sql) for sql in ands) + ")")
    where = "c.updated_at <= clock_timestamp() - make_interval(secs => $1::float8)"
    if ors:
        where += " AND (" + " OR ".join(ors) + ")"
    count_sql = f"SELECT count(*) FROM sandbox.contacts AS c WHERE {where}"
    page_sql = (
        "SELECT c.id, c.properties, c.created_at, c.updated_at FROM sandbox.contacts AS c "
        f"WHERE {where} ORDER BY c.id LIMIT {int(limit)} OFFSET {int(max(offset, 0))}"
    )
    return count_sql, page_sql, args, limit, offset


@router.post("/search")
async def search(request: Request, sandbox: SandboxDep) -> Response:
    """Search with filterGroups (OR of ANDs). Lags behind writes by search_lag_seconds."""

    async def operation() -> Outcome:
        lag = (await sandbox.config()).search_lag_seconds
        built = build_search(await read_json(request), lag)
        if isinstance(built, str):
            return Outcome(validation_error(built), "invalid")
        count_sql, page_sql, args, limit, offset = built
        async with sandbox.pool.acquire() as conn:
            total = await conn.fetchval(count_sql, *args)
            rows = await conn.fetch(page_sql, *args)
        body: dict[str, Any] = {"total": total, "results": [contact_json(r) for r in rows]}
        if offset + limit < total:
            body["paging"] = {"next": {"after": str(offset + limit)}}
        return Outcome(JSONResponse(body))

    return await sandbox.run(request, "crm.search", operation)


# --- get ------------------------------------------------------------------------------


@router.get("/{record_id}")
async def get_contact(
    request: Request, record_id: str, sandbox: SandboxDep, idProperty: str | None = None
) -> Response:
    """Read one record by id or by a unique property; read-after-write, no lag."""

    async def operation() -> Outcome:
        select = "SELECT id, properties, created_at, updated_at FROM sandbox.contacts"
        row: asyncpg.Record | None = None
        if idProperty in (None, "", "hs_object_id"):
            if record_id.isdigit() and len(record_id) < 19:
                row = await sandbox.pool.fetchrow(f"{select} WHERE id = $1", int(record_id))
        elif idProperty == "email":
            row = await sandbox.pool.fetchrow(
                f"{select} WHERE email_lower = $1 ORDER BY email_dup, id LIMIT 1",
                record_id.lower())
        else:
            row = await sandbox.pool.fetchrow(
                f"{select} WHERE id_property = $1 AND id_value = $2", idProperty, record_id
            )
        if row is None and idProperty in (None, "", "hs_object_id") and record_id.isdigit() \
                and len(record_id) < 19:
            # Merged away: HubSpot answers the old ID with the surviving record.
            survivor = await merges.survivor_of(sandbox.pool, int(record_id))
            if survivor is not None:
                row = await sandbox.pool.fetchrow(f"{select} WHERE id = $1", survivor)
        if row is None:
            return Outcome(not_found("Object not found."), "not_found")
        return Outcome(JSONResponse(contact_json(row)))

    return await sandbox.run(request, "crm.search", operation)


# --- merge (as a salesperson merges two contacts) ---------------------------------------


@router.post("/merge")
async def merge_contacts(request: Request, sandbox: SandboxDep) -> Response:
    """`POST /crm/v3/objects/contacts/merge` `{"primaryObjectId", "objectIdToMerge"}`: the
    primary survives (it keeps its ID here) and answers 200 with its record
    (`inboxcrm/sandbox/merges.py`). Fault target `crm.update`."""

    async def operation() -> Outcome:
        body = await read_json(request)
        ids = ([body.get("primaryObjectId"), body.get("objectIdToMerge")]
               if isinstance(body, dict) and set(body) == {"primaryObjectId", "objectIdToMerge"}
               else [])
        if len(ids) != 2 or not all(isinstance(i, str | int) and str(i).isdigit()
                                    and len(str(i)) < 19 for i in ids):
            return Outcome(validation_error("Request body must be {\"primaryObjectId\": …, "
                                            "\"objectIdToMerge\": …}."), "invalid")
        try:
            row = await merges.merge(sandbox.pool, crm="hubspot", survivor=int(str(ids[0])),
                                     merged=int(str(ids[1])))
        except merges.MergeRefused as exc:
            error = not_found(str(exc)) if exc.status == 404 else validation_error(str(exc))
            return Outcome(error, "not_found" if exc.status == 404 else "invalid")
        return Outcome(JSONResponse(contact_json(row)))

    return await sandbox.run(request, "crm.update", operation)


# --- update by record ID ----------------------------------------------------------------

_LOCK_CONTACT = """
SELECT id, id_property, id_value FROM sandbox.contacts WHERE id = $1 FOR UPDATE
"""

_UPDATE_CONTACT = """
UPDATE sandbox.contacts SET properties = properties || $2::jsonb,
    id_property = coalesce(id_property, $3), id_value = coalesce(id_value, $4),
    updated_at = clock_timestamp()
WHERE id = $1
RETURNING id, properties, created_at, updated_at
"""


async def update_contact(pool: asyncpg.Pool, record_id: int,
                         properties: dict[str, str]) -> Outcome:
    """Merge `properties` into the record. A unique property of the account (one used as an
    upsert's idProperty) written onto a record that has none becomes its unique ID, so a
    later read by that idProperty finds it; a value another record holds is a 409."""
    try:
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(_LOCK_CONTACT, record_id)
            if row is None:
                return Outcome(not_found("Object not found."), "not_found")
            id_property = id_value = None
            if row["id_property"] is None:
                unique = {r["name"] for r in await conn.fetch(
                    "SELECT name FROM sandbox.id_properties WHERE name = ANY($1::text[])",
                    list(properties))}
                for name in sorted(unique):
                    if properties[name]:
                        id_property, id_value = name, properties[name]
                        break
            elif properties.get(row["id_property"], row["id_value"]) != row["id_value"]:
                return Outcome(validation_error(
                    f"{row['id_property']} is this record's unique ID and cannot change."),
                    "invalid")
            updated = await conn.fetchrow(_UPDATE_CONTACT, record_id, properties,
                                          id_property, id_value)
    except asyncpg.UniqueViolationError as exc:
        what = "email" if exc.constraint_name == "contacts_email_key" else "unique property"
        return Outcome(crm_error(409, "CONFLICT", f"A contact with that {what} already exists."),
                       "conflict")
    assert updated is not None
    return Outcome(JSONResponse(contact_json(updated)))


@router.patch("/{record_id}")
async def patch_contact(request: Request, record_id: str, sandbox: SandboxDep) -> Response:
    """`PATCH /crm/v3/objects/contacts/{contactId}` `{"properties": {...}}`: update by ID."""

    async def operation() -> Outcome:
        body = await read_json(request)
        props = body.get("properties") if isinstance(body, dict) else None
        if not isinstance(props, dict) or set(body) - {"properties"}:
            return Outcome(validation_error("Request body must be {\"properties\": {...}}."),
                           "invalid")
        if any(not isinstance(v, str | int | float | bool | None) for v in props.values()):
            return Outcome(validation_error("properties values must be scalars."), "invalid")
        properties = {str(k): _as_text(v) for k, v in props.items()}
        if READ_ONLY_PROPERTIES & set(properties):
            return Outcome(read_only_error(sorted(READ_ONLY_PROPERTIES & set(properties))[0]),
                           "invalid")
        email = properties.get("email", "")
        if email and not _EMAIL.match(email):
            return Outcome(validation_error("Property values were not valid: email is invalid."),
                           "invalid")
        if not (record_id.isdigit() and len(record_id) < 19):
            return Outcome(not_found("Object not found."), "not_found")
        return await update_contact(sandbox.pool, int(record_id), properties)

    return await sandbox.run(request, "crm.update", operation)


# --- opt out of all email (communication preferences v4) -----------------------------------

_OPT_OUT_ALL = """
UPDATE sandbox.contacts SET properties = properties || '{"hs_email_optout": "true"}'::jsonb,
    updated_at = clock_timestamp()
WHERE email_lower = $1 AND properties ->> 'hs_email_optout' IS DISTINCT FROM 'true'
"""


@preferences.post("/statuses/{subscriber}/unsubscribe-all")
async def unsubscribe_all(request: Request, subscriber: str, sandbox: SandboxDep,
                          channel: str | None = None) -> Response:
    """`POST /communication-preferences/v4/statuses/{subscriberIdString}/unsubscribe-all
    ?channel=EMAIL`: the address is opted out of all email; its contact shows
    `hs_email_optout` = "true" (the only way to set it, as in HubSpot). Idempotent."""

    async def operation() -> Outcome:
        if channel != "EMAIL":
            return Outcome(validation_error("channel must be EMAIL."), "invalid")
        if not _EMAIL.match(subscriber):
            return Outcome(validation_error("subscriberIdString must be an email address."),
                           "invalid")
        started = now_iso()
        await sandbox.pool.execute(_OPT_OUT_ALL, subscriber.lower())
        body = {"status": "COMPLETE", "startedAt": started, "completedAt": now_iso(),
                "results": [{"subscriberIdString": subscriber, "channel": "EMAIL",
                             "status": "NOT_SUBSCRIBED", "source": "Public API",
                             "timestamp": now_iso(), "wideStatusType": "PORTAL_WIDE"}]}
        return Outcome(JSONResponse(body))

    return await sandbox.run(request, "crm.consent", operation)


# --- property definitions ---------------------------------------------------------------
# `GET /crm/v3/properties/{objectType}/{propertyName}` answers a Property as
# https://developers.hubspot.com/docs/api/crm/properties documents it (`name`, `label`,
# `type`, `fieldType`, `groupName`, `options`, `hasUniqueValue`, `hubspotDefined`,
# `modificationMetadata`, …). HubSpot's own properties used here are not unique; ours
# (`inboxcrm_contact_id`, `inboxcrm_note_id`) and every property the account upserted by are
# unique string properties, unless `crm_fields` in `/_sandbox/config` says otherwise.
HUBSPOT_DEFINED = {
    "contacts": ("email", "firstname", "lastname", "company", "phone", "jobtitle",
                 "lifecyclestage", "hubspot_owner_id", "hs_email_optout", "hs_object_id"),
    "notes": ("hs_note_body", "hs_timestamp", "hs_object_id"),
}
OUR_PROPERTIES = {"contacts": ("inboxcrm_contact_id",), "notes": ("inboxcrm_note_id",)}
_BOOLEAN_PROPERTIES = frozenset({"hs_email_optout"})


def property_json(object_type: str, name: str, unique: bool, hubspot_defined: bool
                  ) -> dict[str, Any]:
    boolean = name in _BOOLEAN_PROPERTIES
    stamp = "2026-01-01T00:00:00.000Z"
    return {
        "name": name, "label": name.replace("_", " "), "description": "",
        "groupName": "contactinformation" if object_type == "contacts" else "inboxcrm",
        "type": "bool" if boolean else "string",
        "fieldType": "booleancheckbox" if boolean else "text",
        "options": [], "displayOrder": -1, "calculated": False, "externalOptions": False,
        "hasUniqueValue": unique, "hidden": False, "hubspotDefined": hubspot_defined,
        "formField": False, "archived": False,
        "createdAt": stamp, "updatedAt": stamp,
        "modificationMetadata": {"archivable": not hubspot_defined,
                                 "readOnlyDefinition": hubspot_defined,
                                 "readOnlyValue": name in READ_ONLY_PROPERTIES},
    }


@properties.get("/{object_type}/{name}")
async def get_property(request: Request, object_type: str, name: str,
                       sandbox: SandboxDep) -> Response:
    async def operation() -> Outcome:
        modes = await field_modes(sandbox.pool)
        missing = crm_error(404, "OBJECT_NOT_FOUND",
                            f"Unable to find property {name} for object type {object_type}")
        if object_type not in HUBSPOT_DEFINED or modes.get(name) == "missing":
            return Outcome(missing, "not_found")
        if name in HUBSPOT_DEFINED[object_type]:
            return Outcome(JSONResponse(property_json(object_type, name, False, True)))
        registered = await sandbox.pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM sandbox.id_properties WHERE name = $1)", name)
        if name not in OUR_PROPERTIES[object_type] and not registered and name not in modes:
            return Outcome(missing, "not_found")
        unique = modes.get(name, "unique") == "unique"
        return Outcome(JSONResponse(property_json(object_type, name, unique, False)))

    return await sandbox.run(request, "crm.search", operation)
