"""The sandbox app: CRM + mail stand-ins plus the `/_sandbox` control and inspection API.

All state is in the `sandbox` schema of the given database, so it survives restarts and
several sandbox processes on one database behave as one service.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Literal, TypeVar

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inboxcrm.sandbox import crm, gmail, graph, mail, notes, pipedrive, salesforce, tamper
from inboxcrm.sandbox.core import (
    KEY_TTL_SECONDS,
    FieldMode,
    Mode,
    Policy,
    Sandbox,
    SandboxDep,
    Target,
    field_modes,
    iso,
)

SCHEMA_LOCK_KEY = 0x5A4D_B0C5  # advisory lock: concurrent starts must not race on DDL


def _schema_sql() -> str:
    return resources.files("inboxcrm.sandbox").joinpath("schema.sql").read_text(encoding="utf-8")


async def keep_session(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's reset query: nothing here sets session state (the only
    lock is transaction-scoped), so that round trip per call is pure cost."""


async def init_connection(conn: asyncpg.Connection) -> None:
    """JSONB in and out as Python objects."""
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def prepare_database(
    pool: asyncpg.Pool, search_lag_seconds: float, hang_seconds: float
) -> None:
    """Create the schema if needed and apply this process's settings."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK_KEY)
        await conn.execute(_schema_sql())
        await conn.execute(
            """
            INSERT INTO sandbox.config (id, search_lag_seconds, hang_seconds)
            VALUES (true, $1, $2)
            ON CONFLICT (id) DO UPDATE
            SET search_lag_seconds = EXCLUDED.search_lag_seconds,
                hang_seconds = EXCLUDED.hang_seconds
            """,
            search_lag_seconds,
            hang_seconds,
        )


class FaultIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: Target
    mode: Mode
    count: int = Field(default=1, ge=1, le=1_000_000)
    retry_after: int = Field(default=1, ge=0, le=86_400)
    # rate_limit on a crm.* target: HubSpot's policyName (default SECONDLY).
    policy: Policy | None = None


class ClockIn(BaseModel):
    """Move the sandbox's clock: forward by `advance_seconds`, or to `offset_seconds` from
    the real time (0: back to real time)."""

    model_config = ConfigDict(extra="forbid")

    advance_seconds: float | None = Field(default=None, ge=0, le=10 * 365 * 86_400)
    offset_seconds: float | None = Field(default=None, ge=0, le=10 * 365 * 86_400)


class ConfigIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    search_lag_seconds: float | None = Field(default=None, ge=0, le=3600)
    hang_seconds: float | None = Field(default=None, ge=0, le=3600)
    # Salesforce OAuth: how long an access token issued from now on is valid.
    session_seconds: float | None = Field(default=None, gt=0, le=30 * 86400)
    # The org's duplicate rule for Contacts (default `alert`, as Salesforce's standard rule).
    salesforce_duplicate_rule: Literal["none", "alert", "block"] | None = None
    # The account's definition of named fields / properties (Salesforce describe, HubSpot
    # property definitions), replacing the previous map: `not_unique`, `not_external_id` or
    # `missing` shows `crm check` a destination without the guarantee.
    crm_fields: dict[str, FieldMode] | None = Field(default=None, max_length=50)


class SeedRecord(BaseModel):
    """A record as a salesperson creates it: no external ID of ours, an owner, and fields
    they set (`properties`, stored under the names given)."""

    model_config = ConfigDict(extra="forbid")

    email: str = Field(min_length=3, max_length=254, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
    firstname: str | None = Field(default=None, max_length=255)
    lastname: str | None = Field(default=None, max_length=255)
    owner: str | None = Field(default=None, max_length=64)
    opted_out: bool = False
    properties: dict[str, str] = Field(default_factory=dict, max_length=50)


class SeedIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    crm: Literal["hubspot", "salesforce", "pipedrive"]
    contacts: list[SeedRecord] = Field(default_factory=list, max_length=1000)
    leads: list[SeedRecord] = Field(default_factory=list, max_length=1000)


# Where each CRM keeps the owner and the email opt-out.
_OWNER_FIELD = {"hubspot": "hubspot_owner_id", "salesforce": "OwnerId"}
_OPT_OUT_FIELD = {"hubspot": "hs_email_optout", "salesforce": "HasOptedOutOfEmail"}
_SEED_CONTACT = """
INSERT INTO sandbox.contacts (id_property, id_value, properties, email_dup)
VALUES (NULL, NULL, $1::jsonb,
        $2 AND EXISTS (SELECT 1 FROM sandbox.contacts WHERE email_lower = lower($3)))
RETURNING id
"""

_BACKDATE = ("UPDATE sandbox.contacts SET created_at = created_at - interval '1 day', "
             "updated_at = updated_at - interval '1 day' WHERE id = $1")


def _seed_properties(crm_name: str, record: SeedRecord) -> dict[str, str]:
    if crm_name == "pipedrive":  # a person: name, owner_id, marketing_status
        return pipedrive.seed_properties(record.firstname, record.lastname, record.email,
                                         record.owner, record.opted_out, record.properties)
    given = record.properties
    if crm_name == "salesforce":  # Salesforce API names, kept as the Salesforce surface does
        given = {salesforce.STANDARD_FIELDS.get(k, k): v for k, v in given.items()}
    props = {**given, "email": record.email}
    if record.firstname:
        props["firstname"] = record.firstname
    if record.lastname or crm_name == "salesforce":  # LastName is required on a Contact
        props["lastname"] = record.lastname or "[not provided]"
    if record.owner:
        props[_OWNER_FIELD[crm_name]] = record.owner
    props[_OPT_OUT_FIELD[crm_name]] = "true" if record.opted_out else "false"
    return props


M = TypeVar("M", bound=BaseModel)


async def _control_body(request: Request, model: type[M]) -> M:
    """Parse a control body whatever its Content-Type, so `curl -d '{...}'` works too."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


def _fault_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": row["id"],
        "target": row["target"],
        "mode": row["mode"],
        "count": row["count"],
        "remaining": row["remaining"],
        "retry_after": row["retry_after"],
        "policy": row["policy"],
    }


_FAULT_COLUMNS = "id, target, mode, count, remaining, retry_after, policy"


def create_app(
    database_url: str,
    *,
    search_lag_seconds: float = 2.0,
    hang_seconds: float = 30.0,
    api_key: str | None = None,
    key_ttl_seconds: float = KEY_TTL_SECONDS,
    latency_seconds: float = 0.0,
) -> FastAPI:
    """The sandbox ASGI app; the pool is opened and the schema ensured at startup."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await asyncpg.create_pool(
            database_url, min_size=1, max_size=20, init=init_connection, reset=keep_session
        )
        try:
            await prepare_database(pool, search_lag_seconds, hang_seconds)
            app.state.sandbox = Sandbox(pool, api_key or None, key_ttl_seconds,
                                        latency_seconds)
            yield
        finally:
            await pool.close()

    app = FastAPI(title="inboxcrm sandbox", lifespan=lifespan, docs_url="/_sandbox/docs")
    app.include_router(crm.router)
    app.include_router(crm.preferences)  # HubSpot's opt-out of all email
    app.include_router(crm.properties)  # HubSpot property definitions (crm check)
    app.include_router(mail.router)
    app.include_router(notes.router)
    app.include_router(notes.associations)
    app.include_router(notes.emails)  # HubSpot email engagements, same table
    app.include_router(salesforce.router)  # same table, same Sandbox.run faults
    app.include_router(salesforce.oauth)  # the token endpoint (client credentials flow)
    app.include_router(pipedrive.router)  # persons and notes (API v1), same tables
    app.include_router(salesforce.control)  # /_sandbox/salesforce: converting a Lead
    app.include_router(tamper.router)  # /_sandbox/contacts, /_sandbox/notes: behind our back
    app.include_router(gmail.router)  # Gmail API subset: /gmail/v1/users/{userId}/...
    app.include_router(gmail.certs)  # the push tokens' keys: /oauth2/v3/certs
    app.include_router(gmail.control)  # /_sandbox/gmail/: deliver, push, expire history
    app.include_router(graph.router)  # Microsoft Graph mail subset (/v1.0/...)
    app.include_router(graph.control)  # /_sandbox/graph: deliver, lifecycle, state

    @app.get("/healthz")
    async def healthz(sandbox: SandboxDep) -> JSONResponse:
        try:
            await sandbox.pool.fetchval("SELECT 1")
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return JSONResponse({"ok": False}, status_code=503)
        return JSONResponse({"ok": True})

    @app.post("/_sandbox/faults")
    async def add_fault(request: Request, sandbox: SandboxDep) -> dict[str, Any]:
        """Queue a fault; faults for one target are consumed oldest first."""
        fault = await _control_body(request, FaultIn)
        row = await sandbox.pool.fetchrow(
            "INSERT INTO sandbox.faults (target, mode, count, remaining, retry_after, policy) "
            f"VALUES ($1, $2, $3, $3, $4, $5) RETURNING {_FAULT_COLUMNS}",
            fault.target,
            fault.mode,
            fault.count,
            fault.retry_after,
            fault.policy,
        )
        if row is None:
            raise RuntimeError("INSERT ... RETURNING returned no row")
        return _fault_json(row)

    @app.get("/_sandbox/faults")
    async def list_faults(sandbox: SandboxDep) -> dict[str, Any]:
        rows = await sandbox.pool.fetch(
            f"SELECT {_FAULT_COLUMNS} FROM sandbox.faults WHERE remaining > 0 ORDER BY id"
        )
        return {"faults": [_fault_json(r) for r in rows]}

    @app.post("/_sandbox/faults/release")
    async def release_faults(sandbox: SandboxDep) -> dict[str, Any]:
        """Let every request a `hold_before_commit` fault holds go on (answered 504, nothing
        committed); `DELETE /_sandbox/faults` releases them too."""
        released = await sandbox.pool.fetchval(
            "WITH r AS (UPDATE sandbox.faults SET released = true "
            "WHERE mode = 'hold_before_commit' AND NOT released RETURNING 1) "
            "SELECT count(*) FROM r")
        return {"released": released}

    @app.delete("/_sandbox/faults")
    async def clear_faults(sandbox: SandboxDep) -> dict[str, Any]:
        await sandbox.pool.execute("DELETE FROM sandbox.faults")
        return {"faults": []}

    @app.get("/_sandbox/state")
    async def state(sandbox: SandboxDep) -> dict[str, Any]:
        """Every record held, so tests can count duplicates on the destination side."""
        async with sandbox.pool.acquire() as conn:
            contacts = await conn.fetch(
                "SELECT id, properties, created_at, updated_at FROM sandbox.contacts ORDER BY id"
            )
            activity_rows = await conn.fetch(f"{notes.SELECT_NOTES} ORDER BY n.id")
            note_rows = [r for r in activity_rows if r["kind"] != "email"]
            leads = await conn.fetch("SELECT id, properties, converted_contact_id, created_at, "
                                     "updated_at FROM sandbox.leads ORDER BY id")
            emails = await conn.fetch(
                "SELECT id, sender, reply_to, recipients, subject, idempotency_key, created_at "
                "FROM sandbox.emails ORDER BY created_at, id"
            )
        return {
            "contacts": [crm.contact_json(r) for r in contacts],
            "leads": [salesforce.lead_state_json(r) for r in leads],
            "notes": [notes.state_json(r) for r in note_rows],
            # Everything logged on a record (notes, email engagements, Tasks), DESIGN §10.
            "activities": [notes.activity_json(r) for r in activity_rows],
            "emails": [
                {
                    "id": str(r["id"]),
                    "to": r["recipients"],
                    "from": r["sender"],
                    "reply_to": r["reply_to"],
                    "subject": r["subject"],
                    "idempotency_key": r["idempotency_key"],
                    "created_at": r["created_at"].isoformat(),
                }
                for r in emails
            ],
        }

    @app.get("/_sandbox/calls")
    async def calls(sandbox: SandboxDep, target: str | None = None) -> dict[str, Any]:
        rows = await sandbox.pool.fetch(
            "SELECT target, outcome, status_code, at, request_id FROM sandbox.calls "
            "WHERE $1::text IS NULL OR target = $1 ORDER BY id",
            target,
        )
        return {
            "calls": [
                {
                    "target": r["target"],
                    "outcome": r["outcome"],
                    "status_code": r["status_code"],
                    "at": iso(r["at"]),
                    "request_id": r["request_id"],
                }
                for r in rows
            ]
        }

    @app.get("/_sandbox/config")
    async def get_config(sandbox: SandboxDep) -> dict[str, Any]:
        config = await sandbox.config()
        row = await sandbox.pool.fetchrow("SELECT session_seconds, salesforce_duplicate_rule "
                                          "FROM sandbox.config WHERE id")
        assert row is not None
        return {
            "search_lag_seconds": config.search_lag_seconds,
            "hang_seconds": config.hang_seconds,
            "session_seconds": float(row["session_seconds"]),
            "salesforce_duplicate_rule": row["salesforce_duplicate_rule"],
            "crm_fields": await field_modes(sandbox.pool),
        }

    @app.post("/_sandbox/config")
    async def set_config(request: Request, sandbox: SandboxDep) -> dict[str, Any]:
        """Change runtime settings for every sandbox process on this database."""
        update = await _control_body(request, ConfigIn)
        await sandbox.pool.execute(
            "UPDATE sandbox.config SET "
            "search_lag_seconds = coalesce($1, search_lag_seconds), "
            "hang_seconds = coalesce($2, hang_seconds), "
            "session_seconds = coalesce($3, session_seconds), "
            "salesforce_duplicate_rule = coalesce($4, salesforce_duplicate_rule), "
            "crm_fields = coalesce($5::jsonb, crm_fields) WHERE id",
            update.search_lag_seconds,
            update.hang_seconds,
            update.session_seconds,
            update.salesforce_duplicate_rule,
            update.crm_fields,
        )
        return await get_config(sandbox)

    @app.post("/_sandbox/seed", response_model=None)
    async def seed(request: Request, sandbox: SandboxDep) -> dict[str, Any] | JSONResponse:
        """Records that were in the CRM before inboxcrm, as a salesperson created them."""
        body = await _control_body(request, SeedIn)
        if body.leads and body.crm != "salesforce":
            return JSONResponse({"detail": "not modelled yet: leads other than salesforce's"},
                                status_code=422)
        created: list[dict[str, str]] = []
        leads: list[dict[str, str]] = []
        try:
            async with sandbox.pool.acquire() as conn, conn.transaction():
                for record in body.contacts:
                    record_id = await conn.fetchval(
                        _SEED_CONTACT, _seed_properties(body.crm, record),
                        body.crm in ("salesforce", "pipedrive"), record.email)
                    if body.crm == "pipedrive":  # there long before us: in the search index
                        await conn.execute(_BACKDATE, record_id)
                    created.append({"id": str(record_id), "email": record.email})
                for record in body.leads:  # a Lead needs a Company, as on Salesforce
                    props = {"Company": "[not provided]", **_seed_properties(body.crm, record)}
                    number = await conn.fetchval(
                        "INSERT INTO sandbox.leads (properties) VALUES ($1::jsonb) "
                        "RETURNING id", props)
                    leads.append({"id": notes.lead_id(number), "email": record.email})
        except asyncpg.UniqueViolationError:
            # HubSpot keeps email unique: a second contact with an email is refused.
            return JSONResponse({"detail": "a hubspot contact with that email exists"},
                                status_code=409)
        return {"contacts": created, "leads": leads}

    @app.get("/_sandbox/clock")
    async def get_clock(sandbox: SandboxDep) -> dict[str, Any]:
        row = await sandbox.pool.fetchrow(
            "SELECT sandbox.now() AS now, clock_offset_seconds FROM sandbox.config WHERE id"
        )
        assert row is not None
        return {"now": iso(row["now"]), "offset_seconds": row["clock_offset_seconds"]}

    @app.post("/_sandbox/clock")
    async def set_clock(request: Request, sandbox: SandboxDep) -> dict[str, Any]:
        """Move the sandbox's time (every process on this database): key expiry, daily limits."""
        move = await _control_body(request, ClockIn)
        if (move.advance_seconds is None) == (move.offset_seconds is None):
            raise RequestValidationError(
                [{"loc": ("body",), "msg": "give advance_seconds or offset_seconds",
                  "type": "value_error"}])
        await sandbox.pool.execute(
            "UPDATE sandbox.config SET clock_offset_seconds = "
            "coalesce($2, clock_offset_seconds + $1) WHERE id",
            move.advance_seconds,
            move.offset_seconds,
        )
        return await get_clock(sandbox)

    @app.post("/_sandbox/reset")
    async def reset(sandbox: SandboxDep) -> dict[str, bool]:
        """Forget all records, faults and calls, and put the clock back to real time; keep the
        settings. Ids are never reused."""
        async with sandbox.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "TRUNCATE sandbox.note_contacts, sandbox.notes, sandbox.leads, sandbox.contacts, "
                "sandbox.emails, "
                "sandbox.email_requests, sandbox.faults, sandbox.calls, sandbox.oauth_tokens"
            )
            await conn.execute("UPDATE sandbox.config SET clock_offset_seconds = 0 WHERE id")
        return {"ok": True}

    return app
