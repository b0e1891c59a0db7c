"""A database role per process kind, and every table's grants to each, declared here and
nowhere else (docs/architecture.md §7, "Database roles"; issue 36, privacy in the store).

The relay answers the internet: a flaw in its intake must not be a way to read who our
contacts are. So its role (`inboxcrm_relay`) has no privilege on `contacts` at all, and only
what intake, the sweeper, the failed-run check, the gauges, the desk's queue and sessions
and the mailbox push endpoints need. The two relay routes that must read a contact (the
review card's planner dry run and one-click unsubscribe) run on a pool of their own under
`inboxcrm_desk`. The workers and the operator's CLI have what their steps write.

The roles are NOLOGIN groups. `apply_grants` (run by the migration runner after every run)
creates the missing ones and brings every table's grants to `GRANTS`, in one transaction.
A table missing from `GRANTS` is granted to no role (fail closed), and
`tests/fast/test_db_roles.py` fails until it is declared: a migration that adds a table
declares who may touch it here, in the same change.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import asyncpg

log = logging.getLogger("inboxcrm.store.roles")

Kind = Literal["relay", "desk", "worker", "operator"]
ROLES: dict[Kind, str] = {
    "relay": "inboxcrm_relay",
    "desk": "inboxcrm_desk",
    "worker": "inboxcrm_worker",
    "operator": "inboxcrm_operator",
}

_ALL = "SELECT, INSERT, UPDATE, DELETE"
_RW = "SELECT, INSERT, UPDATE"
_RI = "SELECT, INSERT"

# table -> {process kind: privileges (SQL, columns allowed: "SELECT (a, b)")}. A kind not
# named has no privilege on the table. Derived from the statements of the store modules each
# kind's code calls (the relay: audit, copies, events, failed_runs, gauges, gmail,
# replay_tokens, review_sessions, reviewers, subscriptions; the desk adds review, consent,
# intents, templates, contacts.lock_contact, suppression), with SELECT wherever a statement
# has a WHERE or RETURNING and UPDATE wherever it locks rows or upserts.
GRANTS: dict[str, dict[Kind, str]] = {
    "audit_log": {"relay": _RI, "desk": _RI, "worker": _ALL, "operator": _ALL},
    "contact_addresses": {"desk": "SELECT", "worker": _ALL, "operator": _ALL},
    "contacts": {"desk": "SELECT, UPDATE", "worker": _RW, "operator": _RW},
    "crm_consent_writes": {"desk": _RW, "worker": _RW, "operator": _RW},
    # The relay's gauges read the latest scheduled drift check's counts, not its findings.
    "drift_reports": {"relay": "SELECT (report_id, trigger, finished_at, sampled, missing, "
                               "changed, duplicate_message_ids, unverifiable, unchecked)",
                      "worker": _RW, "operator": _RW},
    # The gauges count stuck sends, suppression blocks and shared provider message IDs:
    # these columns only, none that leads to a person.
    "followup_intents": {"relay": "SELECT (status, lease_until, cancel_reason, "
                                  "provider_message_id)",
                         "desk": "SELECT, UPDATE", "worker": _RW, "operator": _RW},
    "gmail_messages": {"relay": _RI, "desk": _RI, "worker": _RI, "operator": _RI},
    "imap_cursors": {"worker": _RW, "operator": _RW},
    "imap_messages": {"worker": _RW, "operator": _RW},
    "inbound_copies": {"relay": _RI, "desk": _RI, "worker": _RI, "operator": _RI},
    "inbound_events": {"relay": _RW, "desk": _RW, "worker": _RW, "operator": _RW},
    "mailbox_subscriptions": {"relay": _RW, "desk": _RW, "worker": _RW, "operator": _RW},
    "mailboxes": {"relay": _RW, "desk": _RW, "worker": _ALL, "operator": _ALL},
    "match_decisions": {"desk": "SELECT", "worker": _RW, "operator": _RW},
    "operations": {"desk": "SELECT, UPDATE", "worker": _RW, "operator": _RW},
    "provider_events": {"relay": _RI, "desk": _RI, "worker": _ALL, "operator": _ALL},
    "ramp_hours": {"desk": "SELECT", "worker": _RW, "operator": _RW},
    "review_notices": {"worker": _ALL, "operator": _ALL},
    "review_sessions": {"relay": _ALL, "desk": _ALL, "operator": _ALL},
    "review_tasks": {"relay": _RW, "desk": _RW, "worker": _RW, "operator": _RW},
    "reviewer_names": {"relay": _RI, "desk": _RI, "worker": _RI, "operator": _RI},
    "reviewers": {"relay": _RW, "desk": _RW, "worker": _RW, "operator": _RW},
    "settings": {"relay": "SELECT", "desk": "SELECT", "worker": _ALL, "operator": _ALL},
    "step_attempts": {"worker": _RW, "operator": _RW},
    "suppressions": {"desk": _RW, "worker": _RW, "operator": _RW},
    "template_versions": {"desk": "SELECT", "worker": _RI, "operator": _RI},
    "webhook_replay_tokens": {"relay": "SELECT, INSERT, DELETE",
                              "desk": "SELECT, INSERT, DELETE"},
    "worker_destinations": {"worker": _ALL, "operator": _ALL},
    "schema_migrations": {"operator": "SELECT"},
}

# The schema's tables as the catalog has them (what GRANTS must cover).
TABLES = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') ORDER BY 1
"""
# Each sequence behind a serial or identity column, with its table.
SEQUENCES = """
SELECT s.relname AS sequence, t.relname AS table_name
FROM pg_class s
JOIN pg_namespace n ON n.oid = s.relnamespace
JOIN pg_depend d ON d.objid = s.oid AND d.classid = 'pg_class'::regclass
 AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
JOIN pg_class t ON t.oid = d.refobjid
WHERE s.relkind = 'S' AND n.nspname = current_schema()
"""
SCHEMA = "SELECT current_schema()"
ROLE_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)"
IS_SUPERUSER = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
IS_MEMBER = "SELECT pg_has_role(current_user, $1, 'MEMBER')"
SET_ROLE = "SET ROLE "


class RolesRefused(RuntimeError):
    """The migration user may not create the roles (no CREATEROLE): the message says what to
    do instead. Carries no data, only role names."""


def role_of(kind: Kind, enabled: bool) -> str | None:
    """The role a process of this kind switches to on each connection; None when
    INBOXCRM_DB_ROLE is off (the login user's own privileges apply)."""
    return ROLES[kind] if enabled else None


def quoted(name: str) -> str:
    """A role or table name as an SQL identifier (names come from this module or the
    catalog, never from a request)."""
    return '"' + name.replace('"', '""') + '"'


async def set_role(conn: asyncpg.Connection[Any], role: str) -> None:
    """Switch the session to `role`; a role that does not exist or that the login user is no
    member of is one clear error naming the setting."""
    try:
        await conn.execute(SET_ROLE + quoted(role))
    except (asyncpg.InvalidParameterValueError, asyncpg.InsufficientPrivilegeError) as exc:
        raise RolesRefused(
            f"cannot SET ROLE {role} ({type(exc).__name__}): run the migrations (they create "
            "the roles), make the login user a member of it, or set INBOXCRM_DB_ROLE=false "
            "(docs/architecture.md §7, Database roles)") from None


def undeclared(tables: list[str]) -> list[str]:
    """The tables GRANTS does not name (a test and the runner's warning report them)."""
    return sorted(set(tables) - set(GRANTS))


async def _ensure_roles(conn: asyncpg.Connection[Any]) -> None:
    """Create the NOLOGIN group roles that are missing. Roles are cluster-wide, so another
    database's runner may create one at the same moment: that is fine."""
    superuser = bool(await conn.fetchval(IS_SUPERUSER))
    for role in ROLES.values():
        if not await conn.fetchval(ROLE_EXISTS, role):
            try:
                await conn.execute("CREATE ROLE " + quoted(role) + " NOLOGIN")
            except (asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
                pass
            except asyncpg.InsufficientPrivilegeError:
                raise RolesRefused(
                    f"the migration user may not create role {role}: create the roles "
                    f"{', '.join(ROLES.values())} as NOLOGIN with a user that may, grant them "
                    "to this user, or set INBOXCRM_DB_ROLE=false "
                    "(docs/architecture.md §7, Database roles)") from None
        if not superuser and not await conn.fetchval(IS_MEMBER, role):
            # SET ROLE needs membership; a role's creator holds ADMIN on it (PostgreSQL 16+).
            try:
                await conn.execute("GRANT " + quoted(role) + " TO CURRENT_USER")
            except asyncpg.InsufficientPrivilegeError:
                raise RolesRefused(
                    f"the migration user is no member of role {role} and may not make itself "
                    f"one: grant it {role} (GRANT {role} TO <user>) or set "
                    "INBOXCRM_DB_ROLE=false (docs/architecture.md §7, Database roles)"
                ) from None


async def apply_grants(conn: asyncpg.Connection[Any]) -> list[str]:
    """Create the roles and bring every table's and sequence's grants to GRANTS, in one
    transaction (a running process never sees a table without its grants). Returns the
    tables GRANTS does not name: granted to nobody."""
    await _ensure_roles(conn)
    tables = [r["relname"] for r in await conn.fetch(TABLES)]
    roles = ", ".join(quoted(r) for r in ROLES.values())
    schema = quoted(str(await conn.fetchval(SCHEMA)))
    inserters: dict[str, list[str]] = {}
    async with conn.transaction():
        await conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {roles}")
        await conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {roles}")
        await conn.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {roles}")
        for table in tables:
            for kind, privileges in GRANTS.get(table, {}).items():
                await conn.execute(f"GRANT {privileges} ON TABLE {quoted(table)} TO "
                                   + quoted(ROLES[kind]))
                if "INSERT" in privileges:
                    inserters.setdefault(table, []).append(ROLES[kind])
        for row in await conn.fetch(SEQUENCES):
            for role in inserters.get(row["table_name"], []):
                await conn.execute("GRANT USAGE ON SEQUENCE " + quoted(row["sequence"])
                                   + " TO " + quoted(role))
    missing = undeclared(tables)
    if missing:
        log.warning("tables granted to no role (declare them in inboxcrm/store/roles.py "
                    "GRANTS): %s", ", ".join(missing))
    return missing
