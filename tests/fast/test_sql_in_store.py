"""The store owns SQL (docs/architecture.md §9): no SQL statement is written as a string
anywhere in the product outside `inboxcrm/store`. The sandbox (a separate service), the
benchmark and the tests are exempt. A caller uses a named, parameterised statement or a
small function of the store.

The check reads every module's string constants (f-strings included, docstrings excluded)
and flags the ones that open like an SQL statement; the tests below prove it bites."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers.stack import ROOT

EXEMPT = ("inboxcrm/store/", "inboxcrm/sandbox/", "sandbox/", "bench/", "tests/")
SKIP_DIRS = {".venv", ".data", "node_modules", "__pycache__", ".git"}

# Keywords in upper case as this code base writes SQL; the shapes that are unmistakably SQL
# (`INSERT INTO`, `DELETE FROM`, `UPDATE t SET`, `WITH x AS (`, `SELECT … FROM`) in any case.
_STATEMENT = re.compile(
    r"""^\s*(?:
        SELECT\s
      | (?i:select\s.+\sfrom\s)
      | (?i:insert\s+into\s)
      | (?i:delete\s+from\s)
      | (?i:update\s+[\w.]+(?:\s+(?:as\s+)?\w+)?\s+set\s)
      | (?i:with\s+(?:recursive\s+)?\w+\s+as\s*\()
      | (?:CREATE|DROP|ALTER)\s+(?:DATABASE|TABLE|INDEX|SCHEMA|ROLE|EXTENSION|VIEW|TYPE)\b
      | TRUNCATE\s | LOCK\s+TABLE\s | VACUUM\b
    )""",
    re.VERBOSE | re.DOTALL,
)


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal (an f-string as its literal parts joined), without docstrings;
    the parts of an f-string are not reported again on their own."""
    skip = _docstrings(tree)
    parts: set[int] = set()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = ""
            for value in node.values:
                parts.add(id(value))
                text += value.value if isinstance(value, ast.Constant) else "{}"
            found.append((node.lineno, text))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in skip and id(node) not in parts):
            found.append((node.lineno, node.value))
    return found


def sql_literals(source: str, name: str = "<source>") -> list[str]:
    """`name:line: statement` for every string in `source` that opens like SQL."""
    tree = ast.parse(source, filename=name)
    return [f"{name}:{line}: {' '.join(text.split())[:80]}"
            for line, text in sorted(_strings(tree)) if _STATEMENT.match(text)]


def _product_modules() -> list[Path]:
    modules = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if SKIP_DIRS & set(rel.parts) or rel.as_posix().startswith(EXEMPT):
            continue
        modules.append(path)
    return modules


def test_no_sql_outside_the_store() -> None:
    modules = _product_modules()
    assert any(p.relative_to(ROOT).as_posix() == "inboxcrm/activities/match.py" for p in modules)
    found = [hit for path in modules
             for hit in sql_literals(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not found, "SQL outside inboxcrm/store (move it into the store):\n" + "\n".join(found)


def test_the_store_itself_is_seen_as_sql() -> None:
    """The detector finds the store's own statements: it is not blind to how SQL is written
    here (multi-line, CTEs, f-strings)."""
    store = ROOT / "inboxcrm" / "store"
    hits = [hit for path in sorted(store.glob("*.py"))
            for hit in sql_literals(path.read_text(), path.name)]
    assert len(hits) >= 60, hits
    assert any(h.startswith("ledger.py:") and "WITH limits AS (" in h for h in hits)


@pytest.mark.parametrize("sample", [
    'ROWS = "SELECT contact_id FROM contacts WHERE tenant = $1"',
    'async def f(conn):\n    await conn.fetchval("SELECT true")',
    'Q = """\nINSERT INTO audit_log (tenant) VALUES ($1)\n"""',
    'Q = """\n  WITH done AS (UPDATE operations SET status = $2) SELECT 1\n"""',
    'Q = "update contacts set name = $2 where contact_id = $1"',
    'Q = "UPDATE operations AS o SET attempts = 0"',
    'Q = "delete from webhook_replay_tokens where token = $1"',
    'Q = f"SELECT {columns} FROM inbound_events WHERE event_id = $1"',
    'name = "x"\nQ = f\'CREATE DATABASE "{name}"\'',
    'Q = "WITH RECURSIVE s AS (SELECT 1) SELECT * FROM s"',
    'Q = ("SELECT state FROM inbound_events"\n     " WHERE workflow_id = $1")',
])
def test_an_sql_literal_outside_the_store_is_found(sample: str) -> None:
    assert sql_literals(sample), sample


@pytest.mark.parametrize("sample", [
    'def f():\n    """SELECT the oldest item: a docstring that happens to open with SQL."""',
    'HELP = "Select the tenant whose policy applies."',
    'MESSAGE = "update the contact by hand, then retry"',
    'LABEL = "with a delay of 5 s"',
    'Q = events.START_MATCHING',
])
def test_prose_is_not_sql(sample: str) -> None:
    assert not sql_literals(sample), sample
