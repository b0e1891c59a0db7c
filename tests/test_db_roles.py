"""Privacy in the store (issue 36; docs/architecture.md §7, "Database roles"): the relay's
database role cannot read `contacts`, while intake under it still stores the delivery; the
relay's own process really runs under that role (a grant taken away refuses its intake, and
the runner's grants bring it back); and every table of the migrated schema is declared in
`inboxcrm.store.roles.GRANTS`; a login user that may not create or join the roles gets one
clear error, not a half-granted schema."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from inboxcrm.stack.stack import Stack
from inboxcrm.store import db as inboxcrm_db
from inboxcrm.store import roles
from inboxcrm.store.roles import ROLES, TABLES, Kind, RolesRefused, apply_grants, undeclared
from inboxcrm.verify.probe import StackClient, message_from, unique_email

PLAIN_USER = "inboxcrm_test_plain"  # a login user with no role and no CREATEROLE


@pytest.fixture
async def owner(stack: Stack) -> AsyncIterator[asyncpg.Connection]:
    conn = await inboxcrm_db.connect(stack.database_url)
    yield conn
    await conn.close()


async def _as(stack: Stack, kind: Kind) -> asyncpg.Connection:
    return await inboxcrm_db.connect(stack.database_url, role=ROLES[kind])


async def test_relay_role_cannot_read_contacts_while_intake_stores(
        env: StackClient, stack: Stack) -> None:
    email = unique_email("roles")
    delivery_id = "E-roles-" + email[6:16]
    response = await env.post(message_from(email), delivery_id)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "accepted"
    assert await env.count("SELECT count(*) FROM inbound_events WHERE delivery_id = $1",
                           delivery_id) == 1
    await env.wait_for(lambda: env.contacts_for(email))  # the worker wrote the contact

    relay = await _as(stack, "relay")
    try:
        assert await relay.fetchval("SELECT current_user") == "inboxcrm_relay"
        for statement in ("SELECT count(*) FROM contacts",
                          "SELECT canonical_email FROM contacts LIMIT 1",
                          "SELECT * FROM contact_addresses LIMIT 1",
                          "SELECT contact_id FROM followup_intents LIMIT 1"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await relay.fetchval(statement)
        # What intake and the gauges read is allowed (the refusal above is the role's).
        assert await relay.fetchval(
            "SELECT count(*) FROM inbound_events WHERE delivery_id = $1", delivery_id) == 1
        assert await relay.fetchval(
            "SELECT count(*) FROM followup_intents WHERE status = 'sending'") >= 0
    finally:
        await relay.close()

    desk = await _as(stack, "desk")
    try:
        assert await desk.fetchval(
            "SELECT count(*) FROM contacts WHERE canonical_email = $1", email) == 1
    finally:
        await desk.close()


async def test_the_relay_process_runs_under_its_role(
        env: StackClient, stack: Stack, owner: asyncpg.Connection) -> None:
    """Taking INSERT on inbound_events from the relay's role refuses the relay's intake (503,
    nothing stored): the process's connections are under that role, not the owner's."""
    email = unique_email("rolesoff")
    delivery_id = "E-rolesoff-" + email[9:19]
    raw = message_from(email)
    await owner.execute("REVOKE INSERT ON inbound_events FROM inboxcrm_relay")
    try:
        refused = await env.post(raw, delivery_id)
        assert refused.status_code == 503, refused.text
        assert await env.count("SELECT count(*) FROM inbound_events WHERE delivery_id = $1",
                               delivery_id) == 0
    finally:
        assert await apply_grants(owner) == []
    accepted = await env.post(raw, delivery_id)
    assert accepted.status_code == 200, accepted.text
    assert await env.count("SELECT count(*) FROM inbound_events WHERE delivery_id = $1",
                           delivery_id) == 1


async def test_every_table_of_the_schema_is_declared(
        stack: Stack, owner: asyncpg.Connection) -> None:
    tables = [r["relname"] for r in await owner.fetch(TABLES)]
    assert "contacts" in tables
    assert undeclared(tables) == []
    roles = {r["rolname"] for r in await owner.fetch(
        "SELECT rolname FROM pg_roles WHERE rolname = ANY($1::text[]) AND NOT rolcanlogin",
        list(ROLES.values()))}
    assert roles == set(ROLES.values())


@pytest.fixture
async def plain_url(stack: Stack, owner: asyncpg.Connection) -> AsyncIterator[str]:
    await owner.execute(f"DROP ROLE IF EXISTS {PLAIN_USER}")
    await owner.execute(f"CREATE ROLE {PLAIN_USER} LOGIN NOCREATEROLE")
    parts = urlsplit(stack.database_url)
    yield urlunsplit(parts._replace(netloc=f"{PLAIN_USER}@{parts.hostname}:{parts.port}"))
    await owner.execute(f"DROP ROLE IF EXISTS {PLAIN_USER}")


async def test_a_user_outside_the_roles_is_told_what_to_do(
        plain_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A process whose login user is no member of its role: its connections fail, naming it.
    with pytest.raises(RolesRefused, match="cannot SET ROLE inboxcrm_relay.*INBOXCRM_DB_ROLE"):
        await inboxcrm_db.connect(plain_url, role=ROLES["relay"])
    conn = await asyncpg.connect(plain_url)
    try:
        # The roles exist, the user may not join them.
        with pytest.raises(RolesRefused, match="no member of role inboxcrm_relay"):
            await apply_grants(conn)
        # A role that does not exist yet, and the user may not create roles.
        monkeypatch.setitem(roles.ROLES, "relay", "inboxcrm_test_absent")
        with pytest.raises(RolesRefused, match="may not create role inboxcrm_test_absent"):
            await apply_grants(conn)
        assert not await conn.fetchval(roles.ROLE_EXISTS, "inboxcrm_test_absent")
    finally:
        await conn.close()
