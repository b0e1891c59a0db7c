"""The grants map (`inboxcrm.store.roles.GRANTS`) names every table the migrations create,
and only those: a migration that adds a table fails here until it declares which process
kinds may touch it. Read from the SQL files, no database needed (tests/test_db_roles.py
checks the same against the catalog of a migrated database)."""

from __future__ import annotations

import re

from inboxcrm.store.migrate import migration_files
from inboxcrm.store.roles import GRANTS, ROLES, undeclared

_CREATE = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_][a-z0-9_]*)", re.I)
_DROP = re.compile(r"\bDROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?([a-z_][a-z0-9_]*)", re.I)
_RENAME = re.compile(r"\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?([a-z_][a-z0-9_]*)\s+RENAME\s+TO\s+"
                     r"([a-z_][a-z0-9_]*)", re.I)
_PRIVILEGE = re.compile(r"^(SELECT|INSERT|UPDATE|DELETE)( \([a-z_]+(, [a-z_]+)*\))?$")


def _without_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def migrated_tables() -> set[str]:
    """The tables the migrations leave, in order (created, renamed, dropped), plus the
    runner's own."""
    tables = {"schema_migrations"}
    for _, path in migration_files():
        sql = _without_comments(path.read_text())
        tables |= {name.lower() for name in _CREATE.findall(sql)}
        for old, new in _RENAME.findall(sql):
            tables.discard(old.lower())
            tables.add(new.lower())
        tables -= {name.lower() for name in _DROP.findall(sql)}
    return tables


def test_every_migrated_table_is_declared() -> None:
    missing = undeclared(sorted(migrated_tables()))
    assert missing == [], (
        f"declare {missing} in inboxcrm/store/roles.py GRANTS (which process kinds may "
        "read or write them)")


def test_no_declaration_without_its_table() -> None:
    assert set(GRANTS) - migrated_tables() == set()


def test_the_check_bites() -> None:
    assert undeclared(["contacts", "a_table_added_later"]) == ["a_table_added_later"]


def test_the_relay_has_nothing_on_contacts() -> None:
    assert "relay" not in GRANTS["contacts"]
    assert "relay" not in GRANTS["contact_addresses"]


def test_privileges_are_plain_grants() -> None:
    """Each entry is a list of known privileges (optionally on columns), for a known kind:
    the runner puts them into GRANT statements as they are."""
    for table, grants in GRANTS.items():
        for kind, privileges in grants.items():
            assert kind in ROLES, (table, kind)
            parts = re.split(r",\s*(?![^()]*\))", privileges)
            assert all(_PRIVILEGE.match(part) for part in parts), (table, kind, privileges)
