"""Pipedrive-compatible person and note subset (API v1), in Pipedrive's JSON shapes.

Shapes from Pipedrive's API reference (developers.pipedrive.com/docs/api/v1: Persons,
PersonFields, Notes; the request/response models in the official clients' docs, e.g.
github.com/pipedrive/client-nodejs docs/PersonsApi.md, NotesApi.md, ItemSearchApi.md):

- `GET /v1/personFields` — `{"success": true, "data": [{"id", "key", "name", "field_type",
  …}]}`: the standard fields and one custom text field, `inboxcrm contact ID`, whose key is a
  40-character hash as Pipedrive's custom field keys are (`CUSTOM_FIELD_KEY`).
- `GET /v1/persons/search?term=&fields=email|custom_fields|name|notes&exact_match=true` —
  `{"success": true, "data": {"items": [{"result_score", "item": {"id", "type": "person",
  "name", "emails", "phones", "owner": {"id"}, "custom_fields", "notes", …}}]},
  "additional_data": {"pagination": {…}}}`. `exact_match` is a full, case-insensitive match;
  without it the term (2 characters at least) matches a part. Pipedrive's search is an
  index: a person enters it `search_lag_seconds` (`/_sandbox/config`) after its create
  (updates show at once), so a person created a moment ago is not found yet.
- `GET /v1/persons?sort=id DESC&start=&limit=` — the list of persons (a record read: no
  index, no lag), custom fields by key; `sort` takes first-level fields, as Pipedrive's.
- `GET /v1/persons/{id}` — the person (`email` as `[{"label", "value", "primary"}]`,
  `owner_id` as `{"id", "value", "name"}`, `marketing_status`, custom fields by key); 404
  `{"success": false, "error": "Person not found", …}`.
- `POST /v1/persons` — 201 and the person; `name` is required (400 otherwise). Persons are
  not unique by email, and a custom field is not unique either: Pipedrive has no upsert by
  an external ID, so repeating a create creates another person (that is the point).
- `PUT /v1/persons/{id}` — 200 and the person; only the fields given change.
- `PUT /v1/persons/{id}/merge` (`merge_with_id`) — `{id}` merged into `merge_with_id`: 200
  and the survivor with `merge_what_id`; the merged person is gone (404).
- `POST /v1/notes` (`content` HTML, `person_id`, `add_time` "YYYY-MM-DD HH:MM:SS") — 201 and
  the note; `GET /v1/notes?person_id=&sort=id DESC` — (the person's) notes, a record read;
  `GET /v1/notes/{id}` — one note, its `person_id` the person it is on now.

Persons live in `sandbox.contacts` (a second person with an email another holds is an
`email_dup` row, as Salesforce's duplicates), with `email`, `firstname`, `lastname`, `name`,
`owner_id`, `marketing_status` and custom field keys in `properties`, so `/_sandbox/state`
counts them like the other CRMs' records. Notes are `sandbox.notes` rows (`contact_id` the
person; `hs_timestamp` holds the note's `add_time`).

Auth: `api_token` query parameter or `x-api-token` header (or an OAuth Bearer), checked
against the sandbox's API key; refused with Pipedrive's 401. Fault targets as the other
CRMs: `crm.search` (reads), `crm.upsert` (create), `crm.update` (update), `crm.consent` (an
update of `marketing_status` alone), `crm.note` (note create). Answers `Sandbox.run` makes
itself are re-shaped as Pipedrive's: 401, 429 with `x-ratelimit-limit`,
`x-ratelimit-remaining` and `x-ratelimit-reset` (seconds until the window resets) and
`Retry-After`, 400, 500, 504.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from inboxcrm.sandbox import merges
from inboxcrm.sandbox.core import Outcome, Sandbox, SandboxDep, read_json

router = APIRouter(prefix="/v1")

CUSTOM_FIELD_NAME = "inboxcrm contact ID"
CUSTOM_FIELD_KEY = hashlib.sha1(b"inboxcrm contact ID").hexdigest()  # noqa: S324 - a name
# The user the API token belongs to: a person created without `owner_id` is theirs.
TOKEN_USER_ID = 1
MARKETING_STATUSES = ("no_consent", "unsubscribed", "subscribed", "archived")
NOTE_ID_PROPERTY = "pipedrive"
SEARCH_FIELDS = frozenset({"email", "custom_fields", "name", "notes", "phone"})
MAX_LIMIT = 500
_INFO = "Please check developers.pipedrive.com for more information about Pipedrive API."

# The person fields this subset knows (`GET /v1/personFields`), as Pipedrive lists them.
PERSON_FIELDS: list[dict[str, Any]] = [
    {"id": 9001, "key": "name", "name": "Name", "field_type": "varchar"},
    {"id": 9002, "key": "first_name", "name": "First name", "field_type": "varchar"},
    {"id": 9003, "key": "last_name", "name": "Last name", "field_type": "varchar"},
    {"id": 9004, "key": "email", "name": "Email", "field_type": "varchar"},
    {"id": 9005, "key": "owner_id", "name": "Owner", "field_type": "user"},
    {"id": 9006, "key": "marketing_status", "name": "Marketing status", "field_type": "enum",
     "options": [{"id": s, "label": s} for s in MARKETING_STATUSES]},
    {"id": 9051, "key": CUSTOM_FIELD_KEY, "name": CUSTOM_FIELD_NAME, "field_type": "varchar",
     "edit_flag": True, "searchable_flag": True},
]


def pd_error(status: int, error: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """Pipedrive's error body: `success: false`, `error`, `errorCode`, `error_info`."""
    body = {"success": False, "error": error, "errorCode": status, "error_info": _INFO,
            "data": None, "additional_data": None}
    return JSONResponse(body, status_code=status, headers=headers)


def _ok(data: Any, status: int = 200, **extra: Any) -> JSONResponse:
    return JSONResponse({"success": True, "data": data, **extra}, status_code=status)


def pipedrive_shaped(response: Response) -> Response:
    """An answer `Sandbox.run` made itself (HubSpot-shaped), as Pipedrive gives it."""
    status = response.status_code
    if status == 401:
        return pd_error(401, "unauthorized access")
    if status == 429:
        reset = response.headers.get("retry-after", "2")
        return pd_error(429, "Request over limit", {
            "x-ratelimit-limit": "80", "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": reset, "Retry-After": reset})
    if status == 400:
        return pd_error(400, "Bad request")
    if status == 504:
        return pd_error(504, "Gateway timeout")
    if status >= 500:
        return pd_error(500, "Internal server error")
    return response


def _credential(request: Request) -> str:
    token = request.query_params.get("api_token") or request.headers.get("x-api-token", "")
    if not token:
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        token = bearer if scheme.lower() == "bearer" else ""
    return token.strip()


async def run(request: Request, sandbox: Sandbox, target: str,
              operation: Callable[[], Awaitable[Outcome]]) -> Response:
    """`Sandbox.run` (faults, hold, call log) behind Pipedrive's own credential check."""
    if sandbox.api_key is not None and not hmac.compare_digest(
            _credential(request).encode(), sandbox.api_key.encode()):
        await sandbox.log_call(target, "unauthenticated", 401)
        return pd_error(401, "unauthorized access")
    ran = False

    async def tracked() -> Outcome:
        nonlocal ran
        ran = True
        return await operation()

    response = await sandbox.run(request, target, tracked, authenticated=True)
    return response if ran else pipedrive_shaped(response)


def _pd_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _owner(props: dict[str, Any]) -> dict[str, Any]:
    raw = str(props.get("owner_id") or TOKEN_USER_ID)
    owner: int | str = int(raw) if raw.isdigit() else raw
    return {"id": owner, "value": owner, "name": f"User {raw}", "active_flag": True}


def person_json(row: asyncpg.Record) -> dict[str, Any]:
    props = row["properties"] or {}
    email = props.get("email")
    return {
        "id": row["id"], "company_id": 1, "active_flag": True,
        "name": props.get("name") or "", "first_name": props.get("firstname") or None,
        "last_name": props.get("lastname") or None,
        "email": [{"label": "work", "value": email, "primary": True}] if email else
        [{"value": "", "primary": True}],
        "phone": [{"value": "", "primary": True}],
        "owner_id": _owner(props), "org_id": None, "visible_to": "3",
        "marketing_status": props.get("marketing_status") or "no_consent",
        "add_time": _pd_time(row["created_at"]), "update_time": _pd_time(row["updated_at"]),
        CUSTOM_FIELD_KEY: props.get(CUSTOM_FIELD_KEY) or None,
    }


def _search_item(row: asyncpg.Record, matched_custom: bool) -> dict[str, Any]:
    props = row["properties"] or {}
    custom = props.get(CUSTOM_FIELD_KEY)
    return {"result_score": 1.0, "item": {
        "id": row["id"], "type": "person", "name": props.get("name") or "",
        "phones": [], "emails": [props["email"]] if props.get("email") else [],
        "visible_to": 3, "owner": {"id": _owner(props)["id"]}, "organization": None,
        "custom_fields": [custom] if matched_custom and custom else [], "notes": []}}


_SELECT = "SELECT id, properties, created_at, updated_at FROM sandbox.contacts"


@router.get("/personFields")
async def person_fields(request: Request, sandbox: SandboxDep) -> Response:
    async def operation() -> Outcome:
        return Outcome(_ok(PERSON_FIELDS, additional_data={"pagination": {
            "start": 0, "limit": 100, "more_items_in_collection": False}}))

    return await run(request, sandbox, "crm.search", operation)


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


@router.get("/persons/search")
async def search_persons(request: Request, sandbox: SandboxDep, term: str = "",
                         fields: str | None = None, exact_match: str | None = None,
                         start: int = 0, limit: int = 100) -> Response:
    """Persons whose email / custom fields / name / notes match `term`."""

    async def operation() -> Outcome:
        exact = _flag(exact_match)
        if len(term) < (1 if exact else 2):
            return Outcome(pd_error(400, "Search term must be at least 2 characters long"),
                           "invalid")
        wanted = set((fields or ",".join(sorted(SEARCH_FIELDS))).split(","))
        if not wanted <= SEARCH_FIELDS:
            return Outcome(pd_error(400, "Invalid fields parameter"), "invalid")
        if not 1 <= limit <= MAX_LIMIT or start < 0:
            return Outcome(pd_error(400, "Invalid pagination"), "invalid")
        value = term.lower()
        pattern = value if exact else f"%{value}%"
        lag = (await sandbox.config()).search_lag_seconds
        rows = await sandbox.pool.fetch(
            f"{_SELECT} c WHERE c.created_at <= clock_timestamp() - make_interval(secs => $12) "
            "AND (($2 AND (c.email_lower = $1 OR (NOT $11 AND c.email_lower LIKE $1))) "
            "OR ($3 AND (lower(c.properties ->> $6) = $1 "
            "            OR (NOT $11 AND lower(c.properties ->> $6) LIKE $1))) "
            "OR ($4 AND (lower(c.properties ->> 'name') = $1 "
            "            OR (NOT $11 AND lower(c.properties ->> 'name') LIKE $1))) "
            "OR ($5 AND EXISTS (SELECT 1 FROM sandbox.notes n WHERE n.contact_id = c.id "
            "AND n.id_property = $7 AND lower(n.body) LIKE '%' || $8 || '%'))) "
            "ORDER BY c.id OFFSET $9 LIMIT $10",
            pattern, "email" in wanted, "custom_fields" in wanted, "name" in wanted,
            "notes" in wanted, CUSTOM_FIELD_KEY, NOTE_ID_PROPERTY, value, start, limit + 1,
            exact, lag)
        more = len(rows) > limit
        items = [_search_item(r, "custom_fields" in wanted) for r in rows[:limit]]
        pagination: dict[str, Any] = {"start": start, "limit": limit,
                                      "more_items_in_collection": more}
        if more:
            pagination["next_start"] = start + limit
        return Outcome(_ok({"items": items}, additional_data={"pagination": pagination}))

    return await run(request, sandbox, "crm.search", operation)


_SORTS = {"id": "id", "add_time": "created_at", "update_time": "updated_at"}


@router.get("/persons")
async def list_persons(request: Request, sandbox: SandboxDep, start: int = 0,
                       limit: int = 100, sort: str | None = None) -> Response:
    """All persons, a page at a time (`sort`: `id`, `add_time` or `update_time`, ASC/DESC)."""

    async def operation() -> Outcome:
        if not 1 <= limit <= MAX_LIMIT or start < 0:
            return Outcome(pd_error(400, "Invalid pagination"), "invalid")
        field, _, direction = (sort or "id ASC").strip().partition(" ")
        direction = direction.strip().upper() or "ASC"
        if field not in _SORTS or direction not in ("ASC", "DESC"):
            return Outcome(pd_error(400, "Invalid sort field"), "invalid")
        rows = await sandbox.pool.fetch(
            f"{_SELECT} ORDER BY {_SORTS[field]} {direction}, id {direction} "
            "OFFSET $1 LIMIT $2", start, limit + 1)
        more = len(rows) > limit
        pagination: dict[str, Any] = {"start": start, "limit": limit,
                                      "more_items_in_collection": more}
        if more:
            pagination["next_start"] = start + limit
        return Outcome(_ok([person_json(r) for r in rows[:limit]] or None,
                           additional_data={"pagination": pagination}))

    return await run(request, sandbox, "crm.search", operation)


async def _person(pool: asyncpg.Pool, person_id: int) -> asyncpg.Record | None:
    return await pool.fetchrow(f"{_SELECT} WHERE id = $1", person_id)


@router.get("/persons/{person_id}")
async def get_person(request: Request, person_id: str, sandbox: SandboxDep) -> Response:
    async def operation() -> Outcome:
        row = await _person(sandbox.pool, int(person_id)) if person_id.isdigit() else None
        if row is None:
            return Outcome(pd_error(404, "Person not found"), "not_found")
        return Outcome(_ok(person_json(row)))

    return await run(request, sandbox, "crm.search", operation)


def parse_person(body: Any, creating: bool) -> dict[str, str] | Response:
    """The body's person fields in storage names, or Pipedrive's 400."""
    if not isinstance(body, dict):
        return pd_error(400, "Bad request: the body must be a JSON object")
    stored: dict[str, str] = {}
    for api, column in (("name", "name"), ("first_name", "firstname"),
                        ("last_name", "lastname"), (CUSTOM_FIELD_KEY, CUSTOM_FIELD_KEY)):
        if api in body:
            raw = body[api]
            if raw is not None and not isinstance(raw, str | int | float):
                return pd_error(400, f"Bad request: invalid value of {api}")
            stored[column] = "" if raw is None else str(raw)[:255]
    if "email" in body:
        emails = body["email"] if isinstance(body["email"], list) else [body["email"]]
        values = [e.get("value") if isinstance(e, dict) else e for e in emails]
        primary = next((str(v) for v in values if v), "")
        stored["email"] = primary
    if "owner_id" in body:
        stored["owner_id"] = str(body["owner_id"])
    if "marketing_status" in body:
        status = body["marketing_status"]
        if status not in MARKETING_STATUSES:
            return pd_error(400, "Bad request: invalid marketing_status")
        stored["marketing_status"] = str(status)
    if creating and not stored.get("name", "").strip():
        return pd_error(400, "Name must be given.")
    return stored


_CREATE = """
INSERT INTO sandbox.contacts (id_property, id_value, properties, email_dup)
VALUES (NULL, NULL, $1::jsonb,
        EXISTS (SELECT 1 FROM sandbox.contacts WHERE email_lower = lower(nullif($2, ''))))
RETURNING id, properties, created_at, updated_at
"""


@router.post("/persons")
async def create_person(request: Request, sandbox: SandboxDep) -> Response:
    """Create a person. Not idempotent: nothing in Pipedrive is unique but the ID it gives."""

    async def operation() -> Outcome:
        parsed = parse_person(await read_json(request), creating=True)
        if isinstance(parsed, Response):
            return Outcome(parsed, "invalid")
        parsed.setdefault("owner_id", str(TOKEN_USER_ID))
        parsed.setdefault("marketing_status", "subscribed" if parsed.get("email")
                          else "no_consent")
        if "firstname" not in parsed and "lastname" not in parsed:
            first, _, last = parsed["name"].strip().partition(" ")
            parsed.update(firstname=first, lastname=last.strip())
        async with sandbox.pool.acquire() as conn, conn.transaction():
            # Email is not unique in Pipedrive: one lock keeps the duplicate flag right.
            await conn.execute("LOCK TABLE sandbox.contacts IN SHARE ROW EXCLUSIVE MODE")
            row = await conn.fetchrow(_CREATE, parsed, parsed.get("email", ""))
        assert row is not None
        return Outcome(_ok(person_json(row), 201), "created")

    return await run(request, sandbox, "crm.upsert", operation)


@router.put("/persons/{person_id}")
async def update_person(request: Request, person_id: str, sandbox: SandboxDep) -> Response:
    """Update the fields given. `first_name`/`last_name` without `name` rebuild the name."""
    body = await read_json(request)
    consent_only = isinstance(body, dict) and set(body) == {"marketing_status"}

    async def operation() -> Outcome:
        parsed = parse_person(body, creating=False)
        if isinstance(parsed, Response):
            return Outcome(parsed, "invalid")
        row = await _person(sandbox.pool, int(person_id)) if person_id.isdigit() else None
        if row is None:
            return Outcome(pd_error(404, "Person not found"), "not_found")
        props = {**(row["properties"] or {}), **parsed}
        if "name" not in parsed and ({"firstname", "lastname"} & set(parsed)):
            parsed["name"] = " ".join(p for p in (props.get("firstname"),
                                                  props.get("lastname")) if p)
        if "email" in parsed:  # a changed email: the duplicate flag follows it
            async with sandbox.pool.acquire() as conn, conn.transaction():
                await conn.execute("LOCK TABLE sandbox.contacts IN SHARE ROW EXCLUSIVE MODE")
                await conn.execute(
                    "UPDATE sandbox.contacts SET email_dup = EXISTS (SELECT 1 FROM "
                    "sandbox.contacts o WHERE o.id <> $1 AND o.email_lower = lower($2)), "
                    "properties = properties || $3::jsonb, updated_at = clock_timestamp() "
                    "WHERE id = $1", row["id"], parsed["email"], parsed)
        else:
            await sandbox.pool.execute(
                "UPDATE sandbox.contacts SET properties = properties || $2::jsonb, "
                "updated_at = clock_timestamp() WHERE id = $1", row["id"], parsed)
        updated = await _person(sandbox.pool, row["id"])
        assert updated is not None
        return Outcome(_ok(person_json(updated)))

    return await run(request, sandbox, "crm.consent" if consent_only else "crm.update",
                     operation)


@router.put("/persons/{person_id}/merge")
async def merge_persons(request: Request, person_id: str, sandbox: SandboxDep) -> Response:
    """`PUT /v1/persons/{id}/merge` `{"merge_with_id"}`: `{id}` is merged into `merge_with_id`,
    which survives with its own values (its empty fields filled from the merged person) and
    answers 200 with it and `merge_what_id`; the merged person is removed (its ID answers
    404) and its notes move to the survivor (`inboxcrm/sandbox/merges.py`). Fault target
    `crm.update`."""
    body = await read_json(request)

    async def operation() -> Outcome:
        target = body.get("merge_with_id") if isinstance(body, dict) else None
        if not person_id.isdigit() or not isinstance(target, int) or isinstance(target, bool):
            return Outcome(pd_error(400, "Bad request: merge_with_id must be an integer"),
                           "invalid")
        try:
            row = await merges.merge(sandbox.pool, crm="pipedrive", survivor=target,
                                     merged=int(person_id))
        except merges.MergeRefused as exc:
            status = 404 if exc.status == 404 else 400
            message = "Person not found" if status == 404 else str(exc)
            return Outcome(pd_error(status, message),
                           "not_found" if status == 404 else "invalid")
        return Outcome(_ok({**person_json(row), "merge_what_id": int(person_id)}))

    return await run(request, sandbox, "crm.update", operation)


def _note_json(row: asyncpg.Record) -> dict[str, Any]:
    return {"id": row["id"], "content": row["body"], "person_id": row["contact_id"],
            "deal_id": None, "org_id": None, "lead_id": None, "user_id": TOKEN_USER_ID,
            "active_flag": True, "add_time": row["hs_timestamp"] or _pd_time(row["created_at"]),
            "update_time": _pd_time(row["updated_at"])}


_INSERT_NOTE = """
INSERT INTO sandbox.notes (id_property, id_value, contact_id, body, hs_timestamp)
VALUES ($1, $2, $3, $4, $5)
RETURNING id, contact_id, body, hs_timestamp, created_at, updated_at
"""
_NOTE_COLUMNS = "id, contact_id, body, hs_timestamp, created_at, updated_at"


@router.post("/notes")
async def create_note(request: Request, sandbox: SandboxDep) -> Response:
    """A note on a person. Not idempotent either: each create is a new note."""

    async def operation() -> Outcome:
        body = await read_json(request)
        if not isinstance(body, dict) or not str(body.get("content") or "").strip():
            return Outcome(pd_error(400, "Bad request: content is required"), "invalid")
        person = body.get("person_id")
        if not isinstance(person, int) and not (isinstance(person, str) and person.isdigit()):
            return Outcome(pd_error(400, "Bad request: a note needs a person, deal, "
                                    "organization or lead"), "invalid")
        added = body.get("add_time")
        if added is not None:
            try:
                datetime.strptime(str(added), "%Y-%m-%d %H:%M:%S")
            except ValueError:
                return Outcome(pd_error(400, "Bad request: add_time format"), "invalid")
        try:
            row = await sandbox.pool.fetchrow(
                _INSERT_NOTE, NOTE_ID_PROPERTY, str(uuid.uuid4()), int(person),
                str(body["content"]), str(added) if added else None)
        except asyncpg.ForeignKeyViolationError:
            return Outcome(pd_error(404, "Person not found"), "not_found")
        assert row is not None
        return Outcome(_ok(_note_json(row), 201), "created")

    return await run(request, sandbox, "crm.note", operation)


@router.get("/notes")
async def list_notes(request: Request, sandbox: SandboxDep, person_id: int | None = None,
                     start: int = 0, limit: int = 100, sort: str | None = None) -> Response:
    """Notes (of a person), a page at a time; a record read (`sort` as for persons)."""

    async def operation() -> Outcome:
        if not 1 <= limit <= MAX_LIMIT or start < 0:
            return Outcome(pd_error(400, "Invalid pagination"), "invalid")
        field, _, direction = (sort or "id ASC").strip().partition(" ")
        direction = direction.strip().upper() or "ASC"
        if field not in _SORTS or direction not in ("ASC", "DESC"):
            return Outcome(pd_error(400, "Invalid sort field"), "invalid")
        rows = await sandbox.pool.fetch(
            f"SELECT {_NOTE_COLUMNS} FROM sandbox.notes WHERE id_property = $1 AND "
            "($2::bigint IS NULL OR contact_id = $2) "
            f"ORDER BY {_SORTS[field]} {direction}, id {direction} OFFSET $3 LIMIT $4",
            NOTE_ID_PROPERTY, person_id, start, limit + 1)
        more = len(rows) > limit
        # Pipedrive answers an empty list as `data: null`.
        return Outcome(_ok([_note_json(r) for r in rows[:limit]] or None, additional_data={
            "pagination": {"start": start, "limit": limit,
                           "more_items_in_collection": more}}))

    return await run(request, sandbox, "crm.search", operation)


@router.get("/notes/{note_id}")
async def get_note(request: Request, note_id: str, sandbox: SandboxDep) -> Response:
    """One note by ID (a record read): its `person_id` is the person it is on now (a merge
    moves the merged person's notes to the survivor)."""

    async def operation() -> Outcome:
        row = await sandbox.pool.fetchrow(
            f"SELECT {_NOTE_COLUMNS} FROM sandbox.notes WHERE id_property = $1 AND id = $2",
            NOTE_ID_PROPERTY, int(note_id)) if note_id.isdigit() else None
        if row is None:
            return Outcome(pd_error(404, "Note not found"), "not_found")
        return Outcome(_ok(_note_json(row)))

    return await run(request, sandbox, "crm.search", operation)


def seed_properties(firstname: str | None, lastname: str | None, email: str,
                    owner: str | None, opted_out: bool,
                    given: dict[str, str]) -> dict[str, str]:
    """A person as a salesperson creates it in Pipedrive (no ID of ours): the name, the owner
    (`owner_id`, default the token's user) and the marketing status."""
    name = " ".join(p for p in (firstname, lastname) if p) or email
    return {**given, "email": email, "name": name, "firstname": firstname or "",
            "lastname": lastname or "", "owner_id": owner or str(TOKEN_USER_ID),
            "marketing_status": "unsubscribed" if opted_out else "subscribed"}
