"""Salesforce-compatible Contact subset: upsert by External ID, read by External ID or Id.

- `PATCH /services/data/vXX.X/sobjects/Contact/{Field__c}/{value}` — upsert: 201 created,
  200 updated (API v46.0 and later) or 204 (earlier versions), 300 when the value matches
  several records (a non-unique external ID field), 400/404 error arrays.
- `GET /services/data/vXX.X/sobjects/Contact/{Field__c}/{value}[?fields=A,B]` — 200 record,
  300 several, 404 none. Reads the table, so it is consistent right after a write.
- `GET /services/data/vXX.X/sobjects/Contact/{Id}`.
- `PATCH|GET /services/data/vXX.X/sobjects/Task/{Field__c}/{value}` — a completed Task on a
  Contact (`WhoId`), upserted by its own external ID: the inbound email logged as a note.
  Stored in `sandbox.notes` (the HubSpot notes surface's table), fault target `crm.note`.

Records live in the same `sandbox.contacts` table as the HubSpot surface, so one set of
uniqueness constraints arbitrates both, and `/_sandbox/state` (and the invariant checker)
count them alike: `id_property` is the external ID field, `Email`/`FirstName`/`LastName`
are stored as HubSpot's `email`/`firstname`/`lastname`, other fields under their API
names. Record Ids are the sandbox's numeric ids (real Salesforce Ids are 18-character
strings; the adapter treats them as opaque). A create whose email another Contact holds
meets the org's duplicate rule (`salesforce_duplicate_rule` in `/_sandbox/config`): `none`
creates the second Contact, `alert` (the default, Salesforce's standard rule) answers 400
`DUPLICATES_DETECTED` with `duplicateResult` unless `Sforce-Duplicate-Rule-Header:
allowSave=true`, `block` always refuses. `GET …/query?q=` answers one SOQL shape
(`SELECT … FROM Contact WHERE F = '…' [LIMIT n]`) and `PATCH …/sobjects/Contact/{Id}`
updates by record Id, so an adapter can find and adopt a Contact a salesperson created
(`POST /_sandbox/seed`).

Any custom field (`…__c`) is accepted as an external ID field; a field that is not custom is
a 404 `NOT_FOUND`, as Salesforce answers for a field that is not an external ID.

OAuth 2.0 client credentials flow: `POST /services/oauth2/token` (form-encoded
`grant_type=client_credentials`, `client_id`, `client_secret`; the secret must equal the
sandbox's `--api-key` when one is set) answers Salesforce's token response (`access_token`,
`signature`, `scope`, `instance_url`, `id`, `token_type`, `issued_at` in epoch
milliseconds; no expiry, as Salesforce sends none); errors are `{"error", "error_description"}`
with 400 (`unsupported_grant_type`, `invalid_client`). A token is valid for the org's
session timeout (`session_seconds` in `/_sandbox/config`, default 7200) on the sandbox
clock: move `/_sandbox/clock` past it and every call with the token is a 401
`INVALID_SESSION_ID`. A Bearer that is not an issued token is checked as the API key.

Auth and fault injection are the shared `Sandbox.run` (targets `crm.upsert` for the PATCH,
`crm.search` for reads). Answers `Sandbox.run` makes itself (auth denial, injected faults,
the held timeout) are re-shaped as Salesforce's: `unauthorized` → 401 `INVALID_SESSION_ID`,
`rate_limit` → 403 `REQUEST_LIMIT_EXCEEDED` (no Retry-After, as Salesforce sends none; the
call log still records the fault's own status), `invalid_field` → 400
`FIELD_CUSTOM_VALIDATION_EXCEPTION`, `server_error` → 500 `UNKNOWN_EXCEPTION`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import random
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from inboxcrm.sandbox import merges
from inboxcrm.sandbox.core import Outcome, Sandbox, SandboxDep, field_modes, iso, read_json
from inboxcrm.sandbox.notes import GET_NOTE, UPSERT_LEAD_NOTE, UPSERT_NOTE, lead_id

router = APIRouter(prefix="/services/data")
oauth = APIRouter(prefix="/services/oauth2")

UPSERT_ATTEMPTS = 10
BODY_VERSION = (46, 0)  # from this API version on, an update answers 200 with a body
_VERSION = re.compile(r"^v(\d{2,3})\.(\d)$")
_CUSTOM_FIELD = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,37}__c$")
_RECORD_ID = re.compile(r"^\d{1,18}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# Standard Contact fields accepted, and where the shared table keeps them.
STANDARD_FIELDS = {
    "Email": "email",
    "FirstName": "firstname",
    "LastName": "lastname",
    "Phone": "phone",
    "MobilePhone": "mobilephone",
    "Title": "jobtitle",
    "Department": "department",
    "Description": "description",
    "OwnerId": "OwnerId",
    "HasOptedOutOfEmail": "HasOptedOutOfEmail",
}
STORED_AS = {stored: api for api, stored in STANDARD_FIELDS.items()}
BOOLEAN_FIELDS = ("HasOptedOutOfEmail",)
READ_ONLY_FIELDS = frozenset({"Id", "CreatedDate", "LastModifiedDate", "SystemModstamp"})
# Fields a Lead has beyond the Contact's (Company is required on a Lead; the conversion ones
# are read-only, set by converting the Lead).
LEAD_ONLY_FIELDS = frozenset({"Company", "Status", "IsConverted", "ConvertedContactId"})
LEAD_READ_ONLY = frozenset({"IsConverted", "ConvertedContactId"})
_LEAD_ID = re.compile(r"^00Q(\d{12})$")


def sf_error(status: int, code: str, message: str, fields: list[str] | None = None,
             headers: dict[str, str] | None = None) -> JSONResponse:
    body = [{"message": message, "errorCode": code, "fields": fields or []}]
    return JSONResponse(body, status_code=status, headers=headers)


def _not_found(message: str = "The requested resource does not exist") -> JSONResponse:
    return sf_error(404, "NOT_FOUND", message)


def salesforce_shaped(response: Response) -> Response:
    """An answer `Sandbox.run` made itself (HubSpot-shaped), as Salesforce gives it."""
    status = response.status_code
    if status == 401:
        return sf_error(401, "INVALID_SESSION_ID", "Session expired or invalid")
    if status == 429:
        return sf_error(403, "REQUEST_LIMIT_EXCEEDED", "TotalRequests Limit exceeded.")
    if status == 400:
        return sf_error(400, "FIELD_CUSTOM_VALIDATION_EXCEPTION",
                        "Field values were not valid.", ["Email"])
    if status == 504:
        return sf_error(504, "REQUEST_RUNNING_TOO_LONG", "The request timed out.")
    if status >= 500:
        return sf_error(500, "UNKNOWN_EXCEPTION", "An unexpected error occurred.")
    return response


# Issued access tokens start like a Salesforce session ID (org ID, "!"), so a Bearer is
# told apart from the API key.
TOKEN_PREFIX = "00Dsbx0000000001!"
ORG_ID = "00Dsbx0000000001AAA"
USER_ID = "005sbx0000000001AAA"

_TOKEN_VALID = "SELECT expires_at > sandbox.now() FROM sandbox.oauth_tokens WHERE token = $1"
_ISSUE_TOKEN = """
INSERT INTO sandbox.oauth_tokens (token, client_id, issued_at, expires_at)
SELECT $1, $2, sandbox.now(), sandbox.now() + make_interval(secs => session_seconds)
FROM sandbox.config WHERE id
RETURNING issued_at
"""


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def run(request: Request, sandbox: Sandbox, target: str,
              operation: Callable[[], Awaitable[Outcome]]) -> Response:
    """`Sandbox.run` (auth, faults, hold, call log) with Salesforce-shaped refusals. An
    issued OAuth access token authenticates while its session lasts."""
    ran = False

    async def tracked() -> Outcome:
        nonlocal ran
        ran = True
        return await operation()

    token = _bearer(request)
    authenticated = False
    if token.startswith(TOKEN_PREFIX):
        if not await sandbox.pool.fetchval(_TOKEN_VALID, token):
            await sandbox.log_call(target, "session_expired", 401)
            return sf_error(401, "INVALID_SESSION_ID", "Session expired or invalid")
        authenticated = True
    response = await sandbox.run(request, target, tracked, authenticated=authenticated)
    return response if ran else salesforce_shaped(response)


def _oauth_error(code: str, description: str) -> JSONResponse:
    return JSONResponse({"error": code, "error_description": description}, status_code=400)


@oauth.post("/token")
async def issue_token(request: Request, sandbox: SandboxDep) -> Response:
    """The client credentials flow: a new access token for the connected app."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)

    def value(key: str) -> str:
        return (form.get(key) or [""])[0]

    grant = value("grant_type")
    if grant != "client_credentials":
        await sandbox.log_call("crm.oauth", "invalid", 400)
        return _oauth_error("unsupported_grant_type", "grant type not supported")
    client_id, client_secret = value("client_id"), value("client_secret")
    wrong = sandbox.api_key is not None and not hmac.compare_digest(
        client_secret.encode(), sandbox.api_key.encode())
    if not client_id or not client_secret or wrong:
        await sandbox.log_call("crm.oauth", "unauthenticated", 400)
        return _oauth_error("invalid_client", "invalid client credentials")
    token = TOKEN_PREFIX + secrets.token_urlsafe(48)
    issued = await sandbox.pool.fetchval(_ISSUE_TOKEN, token, client_id)
    await sandbox.log_call("crm.oauth", "ok", 200)
    instance = str(request.base_url).rstrip("/")
    issued_ms = str(int(issued.timestamp() * 1000))
    identity = f"{instance}/id/{ORG_ID}/{USER_ID}"
    signature = base64.b64encode(hmac.new(client_secret.encode(),
                                          (identity + issued_ms).encode(),
                                          hashlib.sha256).digest()).decode()
    return JSONResponse({"access_token": token, "signature": signature, "scope": "api",
                         "token_format": "opaque", "instance_url": instance, "id": identity,
                         "token_type": "Bearer", "issued_at": issued_ms})


def _version(raw: str) -> tuple[int, int] | None:
    match = _VERSION.match(raw)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _record_url(version: str, record_id: int) -> str:
    return f"/services/data/{version}/sobjects/Contact/{record_id}"


def record_json(row: asyncpg.Record, version: str, fields: list[str] | None) -> dict[str, Any]:
    """A Contact as Salesforce returns it (API names), optionally only `fields`."""
    record: dict[str, Any] = {"Id": str(row["id"])}
    for key, value in (row["properties"] or {}).items():
        record[STORED_AS.get(key, key)] = value if value != "" else None
    record["CreatedDate"] = iso(row["created_at"])
    record["LastModifiedDate"] = iso(row["updated_at"])
    for name in BOOLEAN_FIELDS:
        # A checkbox is a JSON boolean, false until set (asked for by name, or present).
        if name in record or (fields and name in fields):
            record[name] = record.get(name) == "true"
    if fields:
        wanted = set(fields) | {"Id"}
        record = {k: v for k, v in record.items() if k in wanted}
    return {"attributes": {"type": "Contact", "url": _record_url(version, row["id"])},
            **record}


def parse_fields(body: Any, field: str | None, value: str | None) -> dict[str, str] | Response:
    """The body's fields in storage names, or the error Salesforce answers."""
    if not isinstance(body, dict):
        return sf_error(400, "JSON_PARSER_ERROR", "The request body must be a JSON object.")
    stored: dict[str, str] = {}
    for name, raw in body.items():
        if name == "attributes":
            continue
        if name in READ_ONLY_FIELDS:
            return sf_error(400, "INVALID_FIELD_FOR_INSERT_UPDATE",
                            f"Unable to create/update fields: {name}.", [name])
        if name not in STANDARD_FIELDS and not _CUSTOM_FIELD.match(name):
            return sf_error(400, "INVALID_FIELD",
                            f"No such column '{name}' on sobject of type Contact", [name])
        if raw is not None and not isinstance(raw, str | int | float | bool):
            return sf_error(400, "JSON_PARSER_ERROR", f"Cannot deserialize value of {name}.",
                            [name])
        text = "" if raw is None else ("true" if raw is True else "false" if raw is False
                                      else str(raw))
        if len(text) > 255:
            return sf_error(400, "STRING_TOO_LONG", f"{name}: data value too large", [name])
        stored[STANDARD_FIELDS.get(name) or str(name)] = text
    if field is not None and stored.get(field, value) != value:
        return sf_error(400, "INVALID_FIELD",
                        f"The external ID field {field} in the body differs from the URL.",
                        [field])
    email = stored.get("email", "")
    if email and not _EMAIL.match(email):
        return sf_error(400, "INVALID_EMAIL_ADDRESS", f"Email: invalid email address: {email}",
                        ["Email"])
    if "lastname" in stored and not stored["lastname"].strip():
        return _missing_last_name()
    if field is not None and value is not None:
        stored[field] = value
    return stored


def _missing_last_name() -> JSONResponse:
    return sf_error(400, "REQUIRED_FIELD_MISSING", "Required fields are missing: [LastName]",
                    ["LastName"])


def _multiple(version: str, rows: list[asyncpg.Record]) -> JSONResponse:
    return JSONResponse([_record_url(version, r["id"]) for r in rows], status_code=300)


_MATCHES = """
SELECT id, id_property, id_value, properties, created_at, updated_at FROM sandbox.contacts
WHERE (id_property = $1 AND id_value = $2) OR properties ->> $1 = $2
ORDER BY id LIMIT 10
"""

_INSERT = """
INSERT INTO sandbox.contacts AS c (id_property, id_value, properties)
VALUES ($1, $2, $3::jsonb)
ON CONFLICT (id_property, id_value) DO UPDATE
SET properties = c.properties || EXCLUDED.properties, updated_at = clock_timestamp()
RETURNING c.id, (c.xmax = 0) AS created
"""

_UPDATE = """
UPDATE sandbox.contacts SET properties = properties || $2::jsonb, updated_at = clock_timestamp()
WHERE id = $1
"""

_OWNER_OF_EMAIL = ("SELECT id_property, id_value FROM sandbox.contacts "
                   "WHERE email_lower = $1 AND NOT email_dup")
REGISTER_ID_FIELD = "INSERT INTO sandbox.id_properties (name) VALUES ($1) ON CONFLICT DO NOTHING"
_SAME_EMAIL = ("SELECT id, properties, created_at, updated_at FROM sandbox.contacts "
               "WHERE email_lower = $1 ORDER BY id LIMIT 10")
_INSERT_DUPLICATE = """
INSERT INTO sandbox.contacts (id_property, id_value, properties, email_dup)
VALUES ($1, $2, $3::jsonb, true) RETURNING id, true AS created
"""
DUPLICATE_RULE = "Standard_Contact_Duplicate_Rule"
MATCH_RULE = "Standard_Contact_Match_Rule_v1_1"
DUPLICATE_MESSAGE = ("You're creating a duplicate record. We recommend you use an existing "
                     "record instead.")
BLOCKED_MESSAGE = "Use one of these records?"


def duplicate_rule_header(request: Request) -> dict[str, bool]:
    """`Sforce-Duplicate-Rule-Header: allowSave=true, includeRecordDetails=true, …`."""
    flags: dict[str, bool] = {}
    for part in request.headers.get("sforce-duplicate-rule-header", "").split(","):
        key, _, value = part.strip().partition("=")
        if key:
            flags[key.strip()] = value.strip().lower() == "true"
    return flags


def duplicates_detected(version: str, rows: list[asyncpg.Record], allow_save: bool,
                        details: bool) -> JSONResponse:
    """Salesforce's refusal by a duplicate rule: 400 `DUPLICATES_DETECTED` with the
    `duplicateResult` naming the matching records (their fields with includeRecordDetails)."""
    message = DUPLICATE_MESSAGE if allow_save else BLOCKED_MESSAGE
    records = [record_json(r, version, None if details else ["Id"]) for r in rows]
    match_records = [{"additionalInformation": [], "fieldDiffs": [], "matchConfidence": 100.0,
                      "record": record} for record in records]
    result = {"allowSave": allow_save, "duplicateRule": DUPLICATE_RULE,
              "duplicateRuleEntityType": "Contact", "errorMessage": message,
              "matchResults": [{"entityType": "Contact", "errors": [],
                                "matchEngine": "ExactMatchEngine",
                                "matchRecords": match_records, "rule": MATCH_RULE,
                                "size": len(match_records), "success": True}]}
    return JSONResponse([{"duplicateResult": result, "errorCode": "DUPLICATES_DETECTED",
                          "fields": [], "message": message}], status_code=400)


async def upsert(pool: asyncpg.Pool, version: str, field: str, value: str,
                 fields: dict[str, str], rule: str = "alert",
                 header: dict[str, bool] | None = None) -> Outcome:
    """Match by external ID, then create, update, or refuse (300) in one transaction.

    A create whose email another Contact holds meets the org's duplicate rule: `none` creates
    the second record; `alert` refuses (400 DUPLICATES_DETECTED, allowSave true) unless the
    request's duplicate rule header says allowSave=true; `block` always refuses."""
    header = header or {}
    body_on_update = (_version(version) or (0, 0)) >= BODY_VERSION
    email = fields.get("email", "").lower()
    for attempt in range(UPSERT_ATTEMPTS):
        updating = False
        try:
            async with pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch(_MATCHES + " FOR UPDATE", field, value)
                if len(rows) > 1:
                    return Outcome(_multiple(version, rows), "multiple_matches")
                if rows:
                    updating = True
                    record_id, created = rows[0]["id"], False
                    await conn.execute(_UPDATE, record_id, fields)
                else:
                    if not fields.get("lastname", "").strip():
                        return Outcome(_missing_last_name(), "invalid")
                    same = await conn.fetch(_SAME_EMAIL, email) if email else []
                    allowed = rule == "none" or (rule == "alert" and header.get("allowSave"))
                    if same and not allowed:
                        return Outcome(duplicates_detected(
                            version, same, rule == "alert",
                            bool(header.get("includeRecordDetails"))), "conflict")
                    row = await conn.fetchrow(_INSERT_DUPLICATE if same else _INSERT,
                                              field, value, fields)
                    if row is None:
                        raise RuntimeError("INSERT ... RETURNING returned no row")
                    record_id, created = row["id"], bool(row["created"])
        except asyncpg.DeadlockDetectedError:
            await asyncio.sleep(random.uniform(0, 0.01 * (attempt + 1)))
            continue
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != "contacts_email_key":
                continue  # lost an insert race on the external ID: the retry updates
            # On a create, a record with the email appeared meanwhile: the retry meets the
            # duplicate rule. On an update, the record took an email another one holds.
            owner = await pool.fetchrow(_OWNER_OF_EMAIL, email)
            if (not updating or owner is None
                    or (owner["id_property"], owner["id_value"]) == (field, value)):
                continue
            return Outcome(sf_error(400, "DUPLICATES_DETECTED", BLOCKED_MESSAGE, ["Email"]),
                           "conflict")
        url = _record_url(version, record_id)
        if created:
            body = {"id": str(record_id), "success": True, "errors": [], "created": True}
            return Outcome(JSONResponse(body, status_code=201, headers={"Location": url}))
        if not body_on_update:
            return Outcome(Response(status_code=204))
        body = {"id": str(record_id), "success": True, "errors": [], "created": False}
        return Outcome(JSONResponse(body, status_code=200))
    raise RuntimeError("upsert kept losing races; giving up")


def _path_error(version: str, field: str | None = None) -> Response | None:
    if _version(version) is None:
        return _not_found()
    if field is not None and not _CUSTOM_FIELD.match(field):
        return _not_found(
            f"Provided external ID field does not exist or is not accessible: {field}")
    return None


# --- describe (the field definitions `crm check` reads) -------------------------------------
# The shape of `GET …/sobjects/{sObject}/describe` (DescribeSObjectResult, its `fields` each a
# DescribeFieldResult: `name`, `type`, `externalId`, `unique`, `idLookup`, `custom`, …), as
# https://developer.salesforce.com/docs/atlas.en-us.api_rest.meta/api_rest/resources_sobject_describe.htm
# and the SOAP API's DescribeFieldResult document it. Fields of ours the org is assumed to
# have (custom text fields, External ID + Unique) unless `crm_fields` in `/_sandbox/config`
# says otherwise.
KEY_PREFIX = {"Contact": "003", "Lead": "00Q", "Task": "00T"}
DEFAULT_CUSTOM_FIELDS = {
    "Contact": ("Inboxcrm_Contact_Id__c", "Inboxcrm_Company__c"),
    "Lead": ("Inboxcrm_Contact_Id__c", "Inboxcrm_Company__c"),
    "Task": ("Inboxcrm_Note_Id__c",),
}
_ID_FIELD_NAMES = ("Inboxcrm_Contact_Id__c", "Inboxcrm_Note_Id__c")
_FIELD_TYPES = {"Email": "email", "HasOptedOutOfEmail": "boolean", "OwnerId": "reference",
                "Phone": "phone", "MobilePhone": "phone", "Description": "textarea",
                "IsConverted": "boolean", "ConvertedContactId": "reference",
                "WhoId": "reference", "ActivityDate": "date", "CreatedDate": "datetime",
                "LastModifiedDate": "datetime", "SystemModstamp": "datetime"}


def _describe_field(name: str, *, unique: bool = False, external: bool = False) -> dict[str, Any]:
    kind = "id" if name == "Id" else _FIELD_TYPES.get(name, "string")
    soap = {"id": "tns:ID", "reference": "tns:ID", "boolean": "xsd:boolean",
            "date": "xsd:date", "datetime": "xsd:dateTime"}.get(kind, "xsd:string")
    writable = name not in READ_ONLY_FIELDS and name not in LEAD_ONLY_FIELDS - {"Company"}
    return {"name": name, "label": name.removesuffix("__c").replace("_", " "), "type": kind,
            "soapType": soap, "length": 0 if kind in ("boolean", "date", "datetime") else 255,
            "custom": name.endswith("__c"), "externalId": external, "unique": unique,
            "idLookup": name in ("Id", "Email") or external, "caseSensitive": False,
            "nillable": name not in ("Id", "LastName", "Company", "IsConverted"),
            "createable": writable, "updateable": writable, "filterable": True,
            "defaultedOnCreate": kind == "boolean" or name == "OwnerId",
            "calculated": False, "autoNumber": False, "referenceTo": (
                ["Contact"] if name == "ConvertedContactId" else
                ["User"] if name == "OwnerId" else []), "relationshipName": None}


async def describe_fields(pool: asyncpg.Pool, sobject: str) -> list[dict[str, Any]]:
    modes = await field_modes(pool)
    standard = (["Id", "WhoId", "Subject", "Description", "Status", "Priority", "ActivityDate"]
                if sobject == "Task" else
                ["Id", *STANDARD_FIELDS, *(sorted(LEAD_ONLY_FIELDS) if sobject == "Lead"
                                          else []), "CreatedDate", "LastModifiedDate"])
    registered = [r["name"] for r in await pool.fetch(
        "SELECT name FROM sandbox.id_properties ORDER BY name") if _CUSTOM_FIELD.match(r["name"])]
    custom = dict.fromkeys([*DEFAULT_CUSTOM_FIELDS[sobject], *registered,
                            *(n for n in modes if _CUSTOM_FIELD.match(n))])
    fields = [_describe_field(name) for name in standard]
    for name in custom:
        mode = modes.get(name, "unique" if name in _ID_FIELD_NAMES or name in registered
                         else "not_external_id")
        if mode == "missing":
            continue
        fields.append(_describe_field(name, unique=mode == "unique",
                                      external=mode in ("unique", "not_unique")))
    return fields


@router.get("/{version}/sobjects/{sobject}/describe")
@router.get("/{version}/sobjects/{sobject}/describe/")  # simple-salesforce's spelling
async def describe(request: Request, version: str, sobject: str,
                   sandbox: SandboxDep) -> Response:
    async def operation() -> Outcome:
        if (error := _path_error(version)) is not None or sobject not in KEY_PREFIX:
            return Outcome(error or sf_error(404, "NOT_FOUND", "The requested resource does "
                                             "not exist"), "not_found")
        base = f"/services/data/{version}/sobjects/{sobject}"
        body = {"name": sobject, "label": sobject, "labelPlural": f"{sobject}s",
                "keyPrefix": KEY_PREFIX[sobject], "custom": False, "createable": True,
                "updateable": True, "deletable": True, "queryable": True,
                "searchable": True, "retrieveable": True, "undeletable": True,
                "mergeable": sobject != "Task", "layoutable": True, "triggerable": True,
                "fields": await describe_fields(sandbox.pool, sobject),
                "childRelationships": [], "recordTypeInfos": [],
                "urls": {"sobject": base, "describe": f"{base}/describe",
                         "rowTemplate": f"{base}/{{ID}}"}}
        return Outcome(JSONResponse(body))

    return await run(request, sandbox, "crm.search", operation)


@router.patch("/{version}/sobjects/Contact/{field}/{value}")
async def upsert_by_external_id(
    request: Request, version: str, field: str, value: str, sandbox: SandboxDep
) -> Response:
    """Create or update the Contact whose external ID field `field` equals `value`."""

    async def operation() -> Outcome:
        if (error := _path_error(version, field)) is not None:
            return Outcome(error, "not_found")
        parsed = parse_fields(await read_json(request), field, value)
        if isinstance(parsed, Response):
            return Outcome(parsed, "invalid")
        await sandbox.pool.execute(REGISTER_ID_FIELD, field)
        rule = await sandbox.pool.fetchval(
            "SELECT salesforce_duplicate_rule FROM sandbox.config WHERE id")
        return await upsert(sandbox.pool, version, field, value, parsed, rule,
                            duplicate_rule_header(request))

    return await run(request, sandbox, "crm.upsert", operation)


@router.get("/{version}/sobjects/Contact/{field}/{value}")
async def get_by_external_id(
    request: Request, version: str, field: str, value: str, sandbox: SandboxDep,
    fields: str | None = None,
) -> Response:
    """Read the Contact(s) whose external ID field `field` equals `value`; no lag."""

    async def operation() -> Outcome:
        if (error := _path_error(version, field)) is not None:
            return Outcome(error, "not_found")
        rows = await sandbox.pool.fetch(_MATCHES, field, value)
        if not rows:
            return Outcome(_not_found(), "not_found")
        if len(rows) > 1:
            return Outcome(_multiple(version, rows), "multiple_matches")
        wanted = [f.strip() for f in fields.split(",") if f.strip()] if fields else None
        return Outcome(JSONResponse(record_json(rows[0], version, wanted)))

    return await run(request, sandbox, "crm.search", operation)


@router.get("/{version}/sobjects/Contact/{record_id}")
async def get_by_id(
    request: Request, version: str, record_id: str, sandbox: SandboxDep,
    fields: str | None = None,
) -> Response:
    async def operation() -> Outcome:
        if (error := _path_error(version)) is not None:
            return Outcome(error, "not_found")
        row = None
        if _RECORD_ID.match(record_id):
            row = await sandbox.pool.fetchrow(
                "SELECT id, properties, created_at, updated_at FROM sandbox.contacts "
                "WHERE id = $1", int(record_id))
            if row is None and await sandbox.pool.fetchval(
                    "SELECT 1 FROM sandbox.merged_contacts WHERE id = $1", int(record_id)):
                # Merged away: the record is deleted (its MasterRecordId: queryAll).
                return Outcome(sf_error(404, "ENTITY_IS_DELETED", "entity is deleted"),
                               "not_found")
        if row is None:
            return Outcome(_not_found(), "not_found")
        wanted = [f.strip() for f in fields.split(",") if f.strip()] if fields else None
        return Outcome(JSONResponse(record_json(row, version, wanted)))

    return await run(request, sandbox, "crm.search", operation)


# --- SOQL query and update by Id (finding and adopting an existing Contact) ----------------
_SOQL = re.compile(
    r"^\s*SELECT\s+(?P<fields>[A-Za-z0-9_]+(?:\s*,\s*[A-Za-z0-9_]+)*)\s+FROM\s+(?P<sobject>Contact|Lead)"
    r"\s+WHERE\s+(?P<field>[A-Za-z0-9_]+)\s*=\s*'(?P<value>(?:[^'\\]|\\.)*)'"
    r"(?:\s+ORDER\s+BY\s+(?P<order>[A-Za-z0-9_]+)(?:\s+(?:ASC|DESC))?)?"
    r"(?:\s+LIMIT\s+(?P<limit>\d{1,4}))?\s*$", re.IGNORECASE)
_SOQL_ESCAPES = {"'": "'", '"': '"', "\\": "\\", "n": "\n", "r": "\r", "t": "\t",
                 "b": "\b", "f": "\f", "%": "%", "_": "_"}
QUERYABLE = frozenset(STANDARD_FIELDS) | READ_ONLY_FIELDS


def _soql_literal(raw: str) -> str | None:
    """A SOQL string literal's value (backslash escapes as SOQL's), None if malformed."""
    out, chars = [], iter(raw)
    for char in chars:
        if char != "\\":
            out.append(char)
            continue
        nxt = next(chars, "")
        if nxt not in _SOQL_ESCAPES:
            return None
        out.append(_SOQL_ESCAPES[nxt])
    return "".join(out)


def _queryable(name: str, sobject: str = "Contact") -> bool:
    known = QUERYABLE | LEAD_ONLY_FIELDS if sobject == "Lead" else QUERYABLE
    return name in known or bool(_CUSTOM_FIELD.match(name))


def parse_soql(query: str) -> tuple[str, list[str], str, str, int] | Response:
    """(sobject, fields, WHERE field, value, limit) of `SELECT … FROM Contact|Lead WHERE F =
    '…'`, the one query shape this subset answers, or Salesforce's error."""
    match = _SOQL.match(query)
    if match is None:
        return sf_error(400, "MALFORMED_QUERY", "unexpected token: the sandbox answers "
                        "SELECT fields FROM Contact|Lead WHERE Field = 'value' [LIMIT n]")
    sobject = "Lead" if match.group("sobject").lower() == "lead" else "Contact"
    fields = [f.strip() for f in match.group("fields").split(",")]
    where = match.group("field")
    for name in [*fields, where]:
        if not _queryable(name, sobject):
            return sf_error(400, "INVALID_FIELD",
                            f"No such column '{name}' on entity '{sobject}'.")
    value = _soql_literal(match.group("value"))
    if value is None:
        return sf_error(400, "MALFORMED_QUERY", "invalid escape sequence in a string literal")
    return sobject, fields, where, value, int(match.group("limit") or 2000)


_SELECT_CONTACTS = "SELECT id, properties, created_at, updated_at FROM sandbox.contacts"


async def query_contacts(pool: asyncpg.Pool, version: str, fields: list[str], where: str,
                         value: str, limit: int) -> dict[str, Any]:
    if where == "Email":
        rows = await pool.fetch(f"{_SELECT_CONTACTS} WHERE email_lower = lower($1) "
                                "ORDER BY id LIMIT $2", value, limit)
    elif where == "Id":
        rows = (await pool.fetch(f"{_SELECT_CONTACTS} WHERE id = $1", int(value))
                if _RECORD_ID.match(value) else [])
    else:
        stored = STANDARD_FIELDS.get(where, where)
        rows = await pool.fetch(f"{_SELECT_CONTACTS} WHERE properties ->> $1 = $2 OR "
                                "(id_property = $1 AND id_value = $2) ORDER BY id LIMIT $3",
                                stored, value, limit)
    records = []
    for row in rows:
        record = record_json(row, version, fields)
        for name in fields:
            record.setdefault(name, None)  # Salesforce answers an empty field as null
        records.append(record)
    return {"totalSize": len(records), "done": True, "records": records}


@router.get("/{version}/query")
@router.get("/{version}/query/")  # simple-salesforce asks for `query/`
async def query(request: Request, version: str, sandbox: SandboxDep,
                q: str | None = None) -> Response:
    """`GET …/query?q=SELECT Id, Email FROM Contact WHERE Email = 'a@b.example'`: a record
    read (no search lag), Email compared case-insensitively as Salesforce does."""

    async def operation() -> Outcome:
        if (error := _path_error(version)) is not None:
            return Outcome(error, "not_found")
        parsed = parse_soql(q or "")
        if isinstance(parsed, Response):
            return Outcome(parsed, "invalid")
        sobject, fields, where, value, limit = parsed
        read = query_leads if sobject == "Lead" else query_contacts
        body = await read(sandbox.pool, version, fields, where, value, limit)
        return Outcome(JSONResponse(body))

    return await run(request, sandbox, "crm.search", operation)


# `queryAll` (deleted records too): `SELECT Id, IsDeleted, MasterRecordId FROM Contact|Lead
# WHERE Id = '…'`, the shape a merge is followed by; a live record answers IsDeleted false.
QUERY_ALL_FIELDS = frozenset({"Id", "IsDeleted", "MasterRecordId"})
# A Lead's conversion, read by the same query (a merged Lead was never converted).
QUERY_ALL_LEAD_FIELDS = QUERY_ALL_FIELDS | {"IsConverted", "ConvertedContactId"}


async def _deleted_state(pool: asyncpg.Pool, sobject: str, value: str
                         ) -> tuple[int, int | None] | None:
    """(number, master) of the Contact or Lead `value` (master None: it is live); None: no
    such record, live or merged."""
    if sobject == "Lead":
        number = lead_number(value)
        if number is None:
            return None
        live = await pool.fetchval("SELECT id FROM sandbox.leads WHERE id = $1", number)
        master = None if live else await merges.lead_survivor_of(pool, number)
    else:
        if not _RECORD_ID.match(value):
            return None
        number = int(value)
        live = await pool.fetchval("SELECT id FROM sandbox.contacts WHERE id = $1", number)
        master = None if live else await merges.survivor_of(pool, number)
    if not live and master is None:
        return None
    return number, master


@router.get("/{version}/queryAll")
@router.get("/{version}/queryAll/")
async def query_all(request: Request, version: str, sandbox: SandboxDep,
                    q: str | None = None) -> Response:
    """`GET …/queryAll?q=SELECT Id, IsDeleted, MasterRecordId FROM Contact WHERE Id = '…'`
    (or `FROM Lead`): a record merged away is deleted, its `MasterRecordId` the survivor
    (the merge's master; followed to the end when the master was merged in turn, as one
    lookup per hop would)."""

    async def operation() -> Outcome:
        if (error := _path_error(version)) is not None:
            return Outcome(error, "not_found")
        match = _SOQL.match(q or "")
        fields = [f.strip() for f in match.group("fields").split(",")] if match else []
        lead = match is not None and match.group("sobject").lower() == "lead"
        allowed = QUERY_ALL_LEAD_FIELDS if lead else QUERY_ALL_FIELDS
        if match is None or match.group("field") != "Id" or not set(fields) <= allowed:
            return Outcome(sf_error(400, "MALFORMED_QUERY", "the sandbox's queryAll answers "
                                    "SELECT Id, IsDeleted, MasterRecordId FROM Contact|Lead "
                                    "WHERE Id = '…'"), "invalid")
        sobject = "Lead" if lead else "Contact"
        value = match.group("value")
        records: list[dict[str, Any]] = []
        found = await _deleted_state(sandbox.pool, sobject, value)
        if found is not None:
            number, master = found
            url = (_lead_url(version, number) if sobject == "Lead"
                   else _record_url(version, number))
            named = (None if master is None
                     else lead_id(master) if sobject == "Lead" else str(master))
            full: dict[str, Any] = {"Id": value, "IsDeleted": master is not None,
                                    "MasterRecordId": named}
            if sobject == "Lead":
                converted = await sandbox.pool.fetchval(
                    "SELECT converted_contact_id FROM sandbox.leads WHERE id = $1", number)
                full["IsConverted"] = converted is not None
                full["ConvertedContactId"] = str(converted) if converted is not None else None
            records.append({"attributes": {"type": sobject, "url": url},
                            **{k: v for k, v in full.items() if k in fields}})
        return Outcome(JSONResponse({"totalSize": len(records), "done": True,
                                     "records": records}))

    return await run(request, sandbox, "crm.search", operation)


_UPDATE_BY_ID = """
UPDATE sandbox.contacts SET properties = properties || $2::jsonb,
    id_property = coalesce(id_property, $3), id_value = coalesce(id_value, $4),
    updated_at = clock_timestamp()
WHERE id = $1
"""


async def update_by_id(pool: asyncpg.Pool, record_id: int, fields: dict[str, str]) -> Outcome:
    """Merge `fields` into the Contact. An External ID field written onto a record that has
    none (one the org uses: an upsert went through it) becomes the record's external ID."""
    try:
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow("SELECT id_property FROM sandbox.contacts WHERE id = $1 "
                                      "FOR UPDATE", record_id)
            if row is None:
                return Outcome(_not_found(), "not_found")
            id_field = id_value = None
            if row["id_property"] is None:
                known = await conn.fetch("SELECT name FROM sandbox.id_properties "
                                         "WHERE name = ANY($1::text[]) ORDER BY name",
                                         [k for k, v in fields.items() if v])
                if known:
                    id_field = known[0]["name"]
                    id_value = fields[id_field]
            await conn.execute(_UPDATE_BY_ID, record_id, fields, id_field, id_value)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name == "contacts_email_key":
            return Outcome(sf_error(400, "DUPLICATES_DETECTED", BLOCKED_MESSAGE, ["Email"]),
                           "conflict")
        return Outcome(sf_error(400, "DUPLICATE_VALUE", "duplicate value found: an external "
                                "ID field value another record holds", list(fields)[:1]),
                       "conflict")
    return Outcome(Response(status_code=204))


@router.patch("/{version}/sobjects/Contact/{record_id}")
async def patch_by_id(request: Request, version: str, record_id: str,
                      sandbox: SandboxDep) -> Response:
    """Update a Contact by its record Id: 204 No Content, as Salesforce answers."""

    async def operation() -> Outcome:
        if (error := _path_error(version)) is not None:
            return Outcome(error, "not_found")
        parsed = parse_fields(await read_json(request), None, None)
        if isinstance(parsed, Response):
            return Outcome(parsed, "invalid")
        if not _RECORD_ID.match(record_id):
            return Outcome(_not_found(), "not_found")
        return await update_by_id(sandbox.pool, int(record_id), parsed)

    return await run(request, sandbox, "crm.update", operation)


# --- Task (the inbound email logged on the Contact) ----------------------------------------
TASK_FIELDS = frozenset({"WhoId", "Subject", "Description", "Status", "Priority", "ActivityDate"})


def _task_json(row: asyncpg.Record, version: str, field: str) -> dict[str, Any]:
    who = (str(row["contact_id"]) if row["contact_id"] is not None
           else lead_id(row["lead_id"]) if row["lead_id"] is not None else None)
    return {"attributes": {"type": "Task",
                           "url": f"/services/data/{version}/sobjects/Task/{row['id']}"},
            "Id": str(row["id"]), "WhoId": who,
            "Subject": row["subject"], "Description": row["body"], field: row["id_value"],
            "CreatedDate": iso(row["created_at"]), "LastModifiedDate": iso(row["updated_at"])}


async def upsert_task(pool: asyncpg.Pool, version: str, field: str, value: str,
                      body: Any) -> Outcome:
    if not isinstance(body, dict):
        return Outcome(sf_error(400, "JSON_PARSER_ERROR", "The request body must be a JSON "
                                "object."), "invalid")
    unknown = [k for k in body if k not in TASK_FIELDS and not _CUSTOM_FIELD.match(k)]
    if unknown:
        return Outcome(sf_error(400, "INVALID_FIELD", f"No such column '{unknown[0]}' on "
                                "sobject of type Task", unknown[:1]), "invalid")
    who, text = str(body.get("WhoId") or ""), str(body.get("Description") or "")
    lead = lead_number(who)
    if not _RECORD_ID.match(who) and lead is None:
        return Outcome(sf_error(400, "INVALID_CROSS_REFERENCE_KEY", "invalid cross reference "
                                "id", ["WhoId"]), "invalid")
    try:
        subject = str(body.get("Subject") or "") or None
        if lead is not None:
            row = await pool.fetchrow(UPSERT_LEAD_NOTE, field, value, lead, text, subject)
        else:
            row = await pool.fetchrow(UPSERT_NOTE, field, value, int(who), text, subject)
    except asyncpg.ForeignKeyViolationError:
        return Outcome(sf_error(400, "INVALID_CROSS_REFERENCE_KEY", "invalid cross reference "
                                "id", ["WhoId"]), "invalid")
    if row is None:
        raise RuntimeError("INSERT ... RETURNING returned no row")
    url = f"/services/data/{version}/sobjects/Task/{row['id']}"
    if row["created"]:
        answer = {"id": str(row["id"]), "success": True, "errors": [], "created": True}
        return Outcome(JSONResponse(answer, status_code=201, headers={"Location": url}))
    if (_version(version) or (0, 0)) < BODY_VERSION:
        return Outcome(Response(status_code=204))
    answer = {"id": str(row["id"]), "success": True, "errors": [], "created": False}
    return Outcome(JSONResponse(answer))


@router.patch("/{version}/sobjects/Task/{field}/{value}")
async def upsert_task_by_external_id(
    request: Request, version: str, field: str, value: str, sandbox: SandboxDep
) -> Response:
    async def operation() -> Outcome:
        if (error := _path_error(version, field)) is not None:
            return Outcome(error, "not_found")
        return await upsert_task(sandbox.pool, version, field, value, await read_json(request))

    return await run(request, sandbox, "crm.note", operation)


@router.get("/{version}/sobjects/Task/{field}/{value}")
async def get_task_by_external_id(
    request: Request, version: str, field: str, value: str, sandbox: SandboxDep,
) -> Response:
    async def operation() -> Outcome:
        if (error := _path_error(version, field)) is not None:
            return Outcome(error, "not_found")
        row = await sandbox.pool.fetchrow(GET_NOTE, field, value)
        if row is None:
            return Outcome(_not_found(), "not_found")
        return Outcome(JSONResponse(_task_json(row, version, field)))

    return await run(request, sandbox, "crm.search", operation)


# --- Leads ---------------------------------------------------------------------------------
# `PATCH|GET …/sobjects/Lead/{Field__c}/{value}` (upsert / read by External ID, as for
# Contacts), `GET|PATCH …/sobjects/Lead/{Id}`, SOQL `FROM Lead`. A Lead needs `LastName` and
# `Company`; a converted Lead (`IsConverted`, `ConvertedContactId`) cannot be updated (400
# `CANNOT_UPDATE_CONVERTED_LEAD`). Converting is `POST /_sandbox/salesforce/leads/{Id}/convert`
# (Salesforce converts through its UI, Apex or the SOAP `convertLead` call, not a REST
# resource): a new Contact from the Lead's fields, or the existing `contact_id`. No duplicate
# rule is modelled for Leads.
control = APIRouter(prefix="/_sandbox/salesforce")


def lead_number(value: str) -> int | None:
    match = _LEAD_ID.match(value)
    return int(match.group(1)) if match else None


def _lead_url(version: str, number: int) -> str:
    return f"/services/data/{version}/sobjects/Lead/{lead_id(number)}"


def lead_json(row: asyncpg.Record, version: str, fields: list[str] | None) -> dict[str, Any]:
    """A Lead as Salesforce returns it (API names), optionally only `fields`."""
    record: dict[str, Any] = {"Id": lead_id(row["id"])}
    for key, value in (row["properties"] or {}).items():
        record[STORED_AS.get(key, key)] = value if value != "" else None
    for name in BOOLEAN_FIELDS:
        if name in record or (fields and name in fields):
            record[name] = record.get(name) == "true"
    converted = row["converted_contact_id"]
    record["IsConverted"] = converted is not None
    record["ConvertedContactId"] = str(converted) if converted is not None else None
    record["CreatedDate"] = iso(row["created_at"])
    record["LastModifiedDate"] = iso(row["updated_at"])
    if fields:
        wanted = set(fields) | {"Id"}
        record = {k: v for k, v in record.items() if k in wanted}
        for name in fields:
            record.setdefault(name, None)
    return {"attributes": {"type": "Lead", "url": _lead_url(version, row["id"])}, **record}


def lead_state_json(row: asyncpg.Record) -> dict[str, Any]:
    """A Lead as `/_sandbox/state` lists it (its fields stored as the Contacts' are)."""
    converted = row["converted_contact_id"]
    return {"id": lead_id(row["id"]), "properties": row["properties"],
            "IsConverted": converted is not None,
            "ConvertedContactId": str(converted) if converted is not None else None,
            "createdAt": iso(row["created_at"]), "updatedAt": iso(row["updated_at"])}


def parse_lead_fields(body: Any, field: str | None, value: str | None
                      ) -> dict[str, str] | Response:
    """`parse_fields` with the Lead's own fields (`Company`, `Status`; the conversion fields
    are read-only)."""
    if not isinstance(body, dict):
        return sf_error(400, "JSON_PARSER_ERROR", "The request body must be a JSON object.")
    own: dict[str, str] = {}
    rest = dict(body)
    for name in LEAD_ONLY_FIELDS:
        if name not in rest:
            continue
        if name in LEAD_READ_ONLY:
            return sf_error(400, "INVALID_FIELD_FOR_INSERT_UPDATE",
                            f"Unable to create/update fields: {name}.", [name])
        raw = rest.pop(name)
        own[name] = "" if raw is None else str(raw)[:256]
    parsed = parse_fields(rest, field, value)
    if isinstance(parsed, Response):
        return parsed
    if "Company" in own and not own["Company"].strip():
        return _missing("Company")
    return {**parsed, **own}


def _missing(*names: str) -> JSONResponse:
    return sf_error(400, "REQUIRED_FIELD_MISSING",
                    f"Required fields are missing: [{', '.join(names)}]", list(names))


_LEAD_COLUMNS = "id, properties, converted_contact_id, created_at, updated_at"
_LEAD_MATCHES = f"""
SELECT {_LEAD_COLUMNS} FROM sandbox.leads
WHERE (id_property = $1 AND id_value = $2) OR properties ->> $1 = $2
ORDER BY id LIMIT 10
"""


def _converted() -> JSONResponse:
    return sf_error(400, "CANNOT_UPDATE_CONVERTED_LEAD", "cannot reference converted lead")


async def upsert_lead(pool: asyncpg.Pool, version: str, field: str, value: str,
                      fields: dict[str, str]) -> Outcome:
    """Create or update the Lead whose external ID `field` is `value`, in one transaction
    (the unique (field, value) pair arbitrates concurrent creates: the loser updates)."""
    body_on_update = (_version(version) or (0, 0)) >= BODY_VERSION
    for _ in range(UPSERT_ATTEMPTS):
        try:
            async with pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch(_LEAD_MATCHES + " FOR UPDATE", field, value)
                if len(rows) > 1:
                    return Outcome(JSONResponse([_lead_url(version, r["id"]) for r in rows],
                                                status_code=300), "multiple_matches")
                if rows:
                    if rows[0]["converted_contact_id"] is not None:
                        return Outcome(_converted(), "invalid")
                    number, created = rows[0]["id"], False
                    await conn.execute("UPDATE sandbox.leads SET properties = properties || "
                                       "$2::jsonb, updated_at = clock_timestamp() "
                                       "WHERE id = $1", number, fields)
                else:
                    missing = [api for api, stored in (("LastName", "lastname"),
                                                       ("Company", "Company"))
                               if not fields.get(stored, "").strip()]
                    if missing:
                        return Outcome(_missing(*missing), "invalid")
                    number = await conn.fetchval(
                        "INSERT INTO sandbox.leads (id_property, id_value, properties) "
                        "VALUES ($1, $2, $3::jsonb) RETURNING id", field, value, fields)
                    created = True
        except asyncpg.UniqueViolationError:
            continue  # lost the create race on the external ID: the retry updates
        url = _lead_url(version, number)
        if created:
            answer = {"id": lead_id(number), "success": True, "errors": [], "created": True}
            return Outcome(JSONResponse(answer, status_code=201, headers={"Location": url}))
        if not body_on_update:
            return Outcome(Response(status_code=204))
        answer = {"id": lead_id(number), "success": True, "errors": [], "created": False}
        return Outcome(JSONResponse(answer))
    raise RuntimeError("lead upsert kept losing races; giving up")


async def query_leads(pool: asyncpg.Pool, version: str, fields: list[str], where: str,
                      value: str, limit: int) -> dict[str, Any]:
    select = f"SELECT {_LEAD_COLUMNS} FROM sandbox.leads"
    if where == "Email":
        rows = await pool.fetch(f"{select} WHERE email_lower = lower($1) ORDER BY id "
                                "LIMIT $2", value, limit)
    elif where == "Id":
        number = lead_number(value)
        rows = await pool.fetch(f"{select} WHERE id = $1", number) if number else []
    else:
        stored = STANDARD_FIELDS.get(where, where)
        rows = await pool.fetch(f"{select} WHERE properties ->> $1 = $2 OR (id_property = $1 "
                                "AND id_value = $2) ORDER BY id LIMIT $3", stored, value, limit)
    records = [lead_json(row, version, fields) for row in rows]
    return {"totalSize": len(records), "done": True, "records": records}


@router.patch("/{version}/sobjects/Lead/{field}/{value}")
async def upsert_lead_by_external_id(request: Request, version: str, field: str, value: str,
                                     sandbox: SandboxDep) -> Response:
    async def operation() -> Outcome:
        if (error := _path_error(version, field)) is not None:
            return Outcome(error, "not_found")
        parsed = parse_lead_fields(await read_json(request), field, value)
        if isinstance(parsed, Response):
            return Outcome(parsed, "invalid")
        await sandbox.pool.execute(REGISTER_ID_FIELD, field)
        return await upsert_lead(sandbox.pool, version, field, value, parsed)

    return await run(request, sandbox, "crm.upsert", operation)


@router.get("/{version}/sobjects/Lead/{field}/{value}")
async def get_lead_by_external_id(request: Request, version: str, field: str, value: str,
                                  sandbox: SandboxDep, fields: str | None = None) -> Response:
    async def operation() -> Outcome:
        if (error := _path_error(version, field)) is not None:
            return Outcome(error, "not_found")
        rows = await sandbox.pool.fetch(_LEAD_MATCHES, field, value)
        if not rows:
            return Outcome(_not_found(), "not_found")
        if len(rows) > 1:
            return Outcome(JSONResponse([_lead_url(version, r["id"]) for r in rows],
                                        status_code=300), "multiple_matches")
        wanted = [f.strip() for f in fields.split(",") if f.strip()] if fields else None
        return Outcome(JSONResponse(lead_json(rows[0], version, wanted)))

    return await run(request, sandbox, "crm.search", operation)


@router.get("/{version}/sobjects/Lead/{record_id}")
async def get_lead(request: Request, version: str, record_id: str, sandbox: SandboxDep,
                   fields: str | None = None) -> Response:
    async def operation() -> Outcome:
        number = lead_number(record_id)
        if _path_error(version) is not None or number is None:
            return Outcome(_not_found(), "not_found")
        row = await sandbox.pool.fetchrow(
            f"SELECT {_LEAD_COLUMNS} FROM sandbox.leads WHERE id = $1", number)
        if row is None and await sandbox.pool.fetchval(
                "SELECT 1 FROM sandbox.merged_leads WHERE id = $1", number):
            # Merged away: deleted, as a merged Contact (its MasterRecordId: queryAll).
            return Outcome(sf_error(404, "ENTITY_IS_DELETED", "entity is deleted"),
                           "not_found")
        if row is None:
            return Outcome(_not_found(), "not_found")
        wanted = [f.strip() for f in fields.split(",") if f.strip()] if fields else None
        return Outcome(JSONResponse(lead_json(row, version, wanted)))

    return await run(request, sandbox, "crm.search", operation)


@router.patch("/{version}/sobjects/Lead/{record_id}")
async def patch_lead(request: Request, version: str, record_id: str,
                     sandbox: SandboxDep) -> Response:
    """Update a Lead by Id (204). An External ID field the org uses, written onto a Lead
    without one, becomes its external ID (as for Contacts)."""

    async def operation() -> Outcome:
        number = lead_number(record_id)
        if _path_error(version) is not None or number is None:
            return Outcome(_not_found(), "not_found")
        parsed = parse_lead_fields(await read_json(request), None, None)
        if isinstance(parsed, Response):
            return Outcome(parsed, "invalid")
        try:
            async with sandbox.pool.acquire() as conn, conn.transaction():
                row = await conn.fetchrow("SELECT id_property, converted_contact_id FROM "
                                          "sandbox.leads WHERE id = $1 FOR UPDATE", number)
                if row is None:
                    return Outcome(_not_found(), "not_found")
                if row["converted_contact_id"] is not None:
                    return Outcome(_converted(), "invalid")
                id_field = id_value = None
                if row["id_property"] is None:
                    known = await conn.fetch("SELECT name FROM sandbox.id_properties WHERE "
                                             "name = ANY($1::text[]) ORDER BY name",
                                             [k for k, v in parsed.items() if v])
                    if known:
                        id_field = known[0]["name"]
                        id_value = parsed[id_field]
                await conn.execute(
                    "UPDATE sandbox.leads SET properties = properties || $2::jsonb, "
                    "id_property = coalesce(id_property, $3), "
                    "id_value = coalesce(id_value, $4), updated_at = clock_timestamp() "
                    "WHERE id = $1", number, parsed, id_field, id_value)
        except asyncpg.UniqueViolationError:
            return Outcome(sf_error(400, "DUPLICATE_VALUE", "duplicate value found: an "
                                    "external ID field value another record holds"),
                           "conflict")
        return Outcome(Response(status_code=204))

    return await run(request, sandbox, "crm.update", operation)


_CONVERT_TO_NEW = """
INSERT INTO sandbox.contacts (id_property, id_value, properties, email_dup)
SELECT NULL, NULL, (l.properties - 'Company' - 'Status') || jsonb_build_object(
           'lastname', coalesce(nullif(l.properties ->> 'lastname', ''), '[not provided]')),
       EXISTS (SELECT 1 FROM sandbox.contacts c WHERE c.email_lower = l.email_lower)
FROM sandbox.leads l WHERE l.id = $1
RETURNING id
"""


@control.post("/leads/{record_id}/convert")
async def convert_lead(request: Request, record_id: str, sandbox: SandboxDep) -> Response:
    """Convert a Lead as a salesperson does: into a new Contact (the Lead's name, email,
    owner and opt-out; none of our external ID: Salesforce copies a custom field only where
    the org maps it) or into the existing `{"contact_id": …}`."""
    body = await read_json(request) or {}
    number = lead_number(record_id)
    target = body.get("contact_id") if isinstance(body, dict) else None
    if number is None or (target is not None and not _RECORD_ID.match(str(target))):
        return JSONResponse({"detail": "unknown lead or contact id"}, status_code=404)
    async with sandbox.pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow("SELECT converted_contact_id FROM sandbox.leads WHERE "
                                  "id = $1 FOR UPDATE", number)
        if row is None:
            return JSONResponse({"detail": "unknown lead"}, status_code=404)
        if row["converted_contact_id"] is not None:
            return JSONResponse({"detail": "the lead is converted already"}, status_code=409)
        if target is None:
            contact = await conn.fetchval(_CONVERT_TO_NEW, number)
        else:
            contact = await conn.fetchval("SELECT id FROM sandbox.contacts WHERE id = $1",
                                          int(str(target)))
            if contact is None:
                return JSONResponse({"detail": "unknown contact"}, status_code=404)
        await conn.execute("UPDATE sandbox.leads SET converted_contact_id = $2, "
                           "updated_at = clock_timestamp() WHERE id = $1", number, contact)
    return JSONResponse({"lead_id": lead_id(number), "contact_id": str(contact)})


@control.post("/merge")
async def merge_contacts(request: Request, sandbox: SandboxDep) -> Response:
    """Merge Contacts, or Leads, as a salesperson does (Salesforce merges through its UI, Apex
    `Database.merge` or the SOAP `merge` call, not a REST resource): `{"masterRecordId": …,
    "recordToMergeIds": [...]}` (at most two, as Salesforce allows, all of the master's
    object). The master keeps its fields; each merged record is deleted, its
    `MasterRecordId` the master, its Tasks moved to the master
    (`inboxcrm/sandbox/merges.py`); a converted Lead cannot be merged."""
    body = await read_json(request)
    master = body.get("masterRecordId") if isinstance(body, dict) else None
    merged = body.get("recordToMergeIds") if isinstance(body, dict) else None
    leads = isinstance(master, str) and lead_number(master) is not None

    def valid(value: object) -> bool:
        """An Id of the master's object."""
        if not isinstance(value, str):
            return False
        return lead_number(value) is not None if leads else bool(_RECORD_ID.match(value))

    if (not valid(master) or not isinstance(merged, list) or not 1 <= len(merged) <= 2
            or not all(valid(m) for m in merged)):
        return sf_error(400, "INVALID_FIELD", "give masterRecordId and 1-2 recordToMergeIds "
                        "(Contact Ids, or Lead Ids)")
    for record in merged:
        try:
            if leads:
                await merges.merge_leads(sandbox.pool, survivor=lead_number(str(master)) or 0,
                                         merged=lead_number(str(record)) or 0)
            else:
                await merges.merge(sandbox.pool, crm="salesforce", survivor=int(str(master)),
                                   merged=int(str(record)))
        except merges.MergeRefused as exc:
            code = "ENTITY_IS_DELETED" if exc.status == 404 else "INVALID_OPERATION"
            return sf_error(exc.status, code, str(exc))
    return JSONResponse({"id": master, "success": True, "mergedRecordIds": merged,
                         "errors": []})
