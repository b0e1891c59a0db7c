"""Store statements are called by keyword (docs/architecture.md §9): outside `inboxcrm/store`
no code passes a statement's `$n` parameters positionally (`conn.fetchrow(events.X, a, b)`),
where a swapped pair of the same type still type-checks. It calls a keyword-only function
of the store instead (`events.start_matching(conn, event_id=…, state=…)`).

The check reads every product module's calls of `execute`, `executemany`, `fetch`,
`fetchrow` and `fetchval` and flags those that pass anything positionally after the
statement (a `*args` too). The files of ALLOWED still do, for now: the list only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.stack import ROOT

EXEMPT = ("inboxcrm/store/", "inboxcrm/sandbox/", "sandbox/", "bench/", "tests/")
SKIP_DIRS = {".venv", ".data", "node_modules", "__pycache__", ".git"}
METHODS = {"execute", "executemany", "fetch", "fetchrow", "fetchval"}

# No file is left: every call site outside inboxcrm/store uses its keyword-only functions.
ALLOWED: set[str] = set()


def positional_calls(source: str, name: str = "<source>") -> list[str]:
    """`name:line: call` for every statement call with positional SQL parameters."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in METHODS and node.args):
            continue
        if len(node.args) > 1 or any(isinstance(a, ast.Starred) for a in node.args):
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)[:90]}")
    return found


def _product_modules() -> list[Path]:
    return [path for path in sorted(ROOT.rglob("*.py"))
            if not SKIP_DIRS & set(path.relative_to(ROOT).parts)
            and not path.relative_to(ROOT).as_posix().startswith(EXEMPT)]


def test_no_call_site_passes_positional_sql_parameters() -> None:
    modules = _product_modules()
    names = {p.relative_to(ROOT).as_posix() for p in modules}
    assert "inboxcrm/activities/match.py" in names and names >= ALLOWED
    found = [hit for path in modules if path.relative_to(ROOT).as_posix() not in ALLOWED
             for hit in positional_calls(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not found, ("positional SQL parameters outside inboxcrm/store (call a keyword-only "
                       "function of the store):\n" + "\n".join(found))


def test_the_allow_list_only_shrinks() -> None:
    """A file on the list that no longer needs it must leave it."""
    clean = [name for name in sorted(ALLOWED)
             if not positional_calls((ROOT / name).read_text(), name)]
    assert not clean, f"no positional SQL parameters left: remove from ALLOWED: {clean}"


def test_the_store_itself_is_seen() -> None:
    """The detector is not blind to how the store calls its statements."""
    hits = [hit for path in sorted((ROOT / "inboxcrm" / "store").glob("*.py"))
            for hit in positional_calls(path.read_text(), path.name)]
    assert len(hits) >= 40, hits


@pytest.mark.parametrize("sample", [
    "async def f(conn):\n    await conn.fetchrow(events.START_MATCHING, event_id, state)",
    "async def f(self):\n    await self._pool.execute(settle, a, b, c)",
    "async def f(conn, args):\n    await conn.execute(*args)",
    "async def f(conn):\n    rows = await conn.fetch(contacts.FIND_NAME_CANDIDATES, t, n)",
    "async def f(conn):\n    await conn.executemany(Q, rows)",
    "async def f(conn):\n    v = await conn.fetchval(ramp.TAKE_SLOT, t, 3)",
])
def test_a_positional_call_is_found(sample: str) -> None:
    assert positional_calls(sample), sample


@pytest.mark.parametrize("sample", [
    "async def f(conn):\n    await events.start_matching(conn, event_id=e, state=s)",
    "async def f(conn):\n    await conn.fetchval(db.PING)",
    "async def f(conn):\n    await conn.execute(gauges.STORE_GAUGES)",
    "def f(client):\n    client.fetch_history()",
])
def test_a_keyword_call_passes(sample: str) -> None:
    assert not positional_calls(sample), sample
