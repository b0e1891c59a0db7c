"""The documents match the tree: every section the code cites exists in docs/architecture.md,
§9 names every room of `.importlinter` and every module in it, and every repository path the
README, CONTRIBUTING and the architecture document mention exists."""

from __future__ import annotations

import configparser
import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.stack import ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"
SECTIONS = {
    1: "Shape", 2: "Keys", 3: "Per-item states", 4: "Failure classification",
    5: "Activities", 6: "People in the loop", 7: "Privacy and security", 8: "Running it",
    9: "Rooms", 10: "Interfaces",
}
CITING_SUFFIXES = {".py", ".sql", ".md", ".toml", ".cfg", ".yml", ".yaml", ""}
SKIP_DIRS = {".git", ".venv", ".data", "node_modules", "__pycache__", "test-artifacts"}
# `docs/architecture.md §3`, `section 10 of docs/architecture.md`, (docs/architecture.md,
# "People in the loop")
CITE_NUMBER = re.compile(r"docs/architecture\.md`?\s*§(\d+)|section (\d+) of `?docs/architecture")
CITE_TITLE = re.compile(r"docs/architecture\.md`?,?\s*\(?\"([^\"\n]+)\"")
# A path in backticks that starts at a top-level folder of the repository.
TOP_LEVEL = ("inboxcrm", "tests", "deploy", "bench", "policies", "sandbox", "docs")
PATH = re.compile(r"`((?:" + "|".join(TOP_LEVEL) + r")/[^`\s]*)`")


def sections() -> dict[int, str]:
    found = re.findall(r"^## (\d+)\. ([^(\n]+?)(?: \(.*\))?$", ARCHITECTURE.read_text(), re.M)
    return {int(number): title for number, title in found}


def section_text(number: int) -> str:
    text = ARCHITECTURE.read_text()
    start = re.search(rf"^## {number}\. .*$", text, re.M)
    assert start is not None
    end = re.search(r"^## \d+\. ", text[start.end():], re.M)
    return text[start.end(): start.end() + end.start() if end else len(text)]


def repository_files() -> list[Path]:
    files = []
    for path in ROOT.rglob("*"):
        if SKIP_DIRS & set(path.relative_to(ROOT).parts) or not path.is_file():
            continue
        if path.suffix in CITING_SUFFIXES and path.stat().st_size < 1_000_000:
            files.append(path)
    return files


def test_the_sections_keep_their_numbers() -> None:
    """Code cites sections by number: renumbering would silently point every citation at
    the wrong text."""
    assert sections() == SECTIONS


def test_every_citation_names_a_section_that_exists() -> None:
    numbers, titles = set(sections()), set(sections().values())
    cited = 0
    for path in repository_files():
        if path in (ARCHITECTURE, Path(__file__)):
            continue
        text = path.read_text(errors="replace")
        for match in CITE_NUMBER.finditer(text):
            number = int(match.group(1) or match.group(2))
            assert number in numbers, f"{path.relative_to(ROOT)} cites §{number}"
            cited += 1
        for title in CITE_TITLE.findall(text):
            assert title in titles, f"{path.relative_to(ROOT)} cites section {title!r}"
            cited += 1
    assert cited >= 20  # the citations are there to be checked


def layer_of() -> dict[str, int]:
    """Each room of the contract -> its layer, 0 at the top."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    lines = [line for line in config["importlinter:contract:rooms"]["layers"].split("\n")
             if line.strip()]
    return {room.strip(): level for level, line in enumerate(lines)
            for room in line.split("|")}


def layers() -> list[str]:
    return list(layer_of())


def room_rows() -> dict[str, str]:
    rows = {}
    for line in section_text(9).splitlines():
        match = re.match(r"^\| `([a-z.]+)` \|", line)
        if match:
            rows[match.group(1)] = line
    return rows


def test_section_9_has_a_row_for_every_room_of_the_contract() -> None:
    rooms, level = layers(), layer_of()
    rows = list(room_rows())
    assert sorted(rows) == sorted(rooms)
    assert [level[r] for r in rows] == sorted((level[r] for r in rows), reverse=True), (
        "§9's table goes from the bottom room up")
    diagram = section_text(9)
    for room in rooms:
        assert re.search(rf"^{re.escape(room)}\b", diagram, re.M) or f"| {room}" in diagram, (
            f"{room} missing from §9's diagram")


@pytest.mark.parametrize("room", layers())
def test_section_9_names_every_module_of_the_room(room: str) -> None:
    row = room_rows()[room]
    folder = ROOT.joinpath(*room.split("."))
    if not folder.is_dir():
        assert (folder.with_suffix(".py")).name in row
        return
    for module in sorted(folder.glob("*.py")):
        if module.name != "__init__.py":
            assert module.name in row, f"§9: {room} does not name {module.name}"
    for package in sorted(p for p in folder.iterdir() if (p / "__init__.py").exists()):
        assert f"{package.name}/" in row, f"§9: {room} does not name {package.name}/"


@pytest.mark.parametrize("document", ["README.md", "CONTRIBUTING.md", "docs/architecture.md"])
def test_every_path_a_document_mentions_exists(document: str) -> None:
    text = (ROOT / document).read_text()
    checked = 0
    for raw in PATH.findall(text):
        path = raw.rstrip(".,:;)")
        if re.search(r"[<{*…]|NNN", path):  # a pattern, not a path
            continue
        path = path.split("::")[0]
        assert (ROOT / path).exists(), f"{document} mentions {path}, which does not exist"
        checked += 1
    assert checked > 0


def test_the_readme_layout_matches_the_tree() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Layout"):]
    block = section[section.index("```\n") + 4: section.index("\n```", section.index("```\n"))]
    # The left column: single-word paths (the right column describes them in prose).
    words = {word.strip() for line in block.splitlines() for word in re.split(r"\s{2,}", line)}
    named = {word.rstrip("/") for word in words
             if word and " " not in word and ("/" in word or word.endswith(".py"))}
    for path in named:
        assert (ROOT / path).exists(), f"README layout names {path}, which does not exist"
    rooms = {str(p.relative_to(ROOT)) for p in (ROOT / "inboxcrm").iterdir()
             if (p / "__init__.py").exists()}
    assert rooms <= named, f"README layout misses {sorted(rooms - named)}"
    assert {"inboxcrm/cli", "inboxcrm/worker.py", "inboxcrm/workflows", "inboxcrm/activities",
            "inboxcrm/schemas", "inboxcrm/sandbox", "sandbox"} <= named


# --- claims the documents make about the code, checked against the code -------------------
def _documents() -> dict[str, str]:
    return {name: (ROOT / name).read_text()
            for name in ("README.md", "CONTRIBUTING.md", "docs/architecture.md")}


def _seconds(words: str) -> float:
    return 3600.0 if words == "an hour" else float(words.rstrip(" s"))


def test_the_pause_timing_the_documents_give_is_the_workflows() -> None:
    """"re-check(s) after 5 s, backing off to an hour"; 0.1.0's "5 s → 60 s" poll is
    retired with its runs."""
    from inboxcrm.workflows.step_options import PAUSE_FALLBACK_MAX, PAUSE_POLL

    found = 0
    for name, text in _documents().items():
        flat = " ".join(text.split())
        for first, cap in re.findall(r"re-checks? after (\d+ s), backing off to (an hour|\d+ s)",
                                     flat):
            assert (_seconds(first), _seconds(cap)) == (
                PAUSE_POLL.total_seconds(), PAUSE_FALLBACK_MAX.total_seconds()), name
            found += 1
        assert not re.findall(r"(\d+) s → (\d+) s poll", flat), name
        assert "backing off to 60 s" not in flat, name
    assert found >= 2


def test_what_the_documents_say_about_heartbeats_is_true() -> None:
    """Steps are local activities (no heartbeats); the one regular activity, the model call
    on its own task queue, heartbeats every INTERVAL_SECONDS."""
    import inspect

    from inboxcrm.activities import heartbeat
    from inboxcrm.workflows.inbound_email import InboundEmailWorkflow

    step = inspect.getsource(InboundEmailWorkflow._activity)
    regular = step.index("if task_queue is not None:")
    assert regular < step.index("execute_activity_method(") < step.index(
        "execute_local_activity_method")
    assert step.count("execute_activity_method(") == 1
    assert "is_local" in inspect.getsource(heartbeat.heartbeating)
    claims = 0
    for name, text in _documents().items():
        flat = " ".join(text.split())
        assert "Activities heartbeat every" not in flat, name
        for seconds in re.findall(r"heartbeat every (\d+) s", flat):
            assert float(seconds) == heartbeat.INTERVAL_SECONDS, name
            claims += 1
    assert claims >= 1


def test_one_follow_up_per_contact_per_quiet_period_under_any_rule() -> None:
    """The documents promise one follow-up per contact per quiet period, whatever the rule;
    the planner's statement must not narrow it to a rule."""
    from inboxcrm.store.intents import FOLLOWUP_BLOCKERS

    assert "rule_id" not in FOLLOWUP_BLOCKERS and "contact_id = $3" in FOLLOWUP_BLOCKERS
    for name, text in _documents().items():
        assert "per contact and rule" not in " ".join(text.split()), name
    keys = section_text(2)
    assert "at most one per contact per quiet period, under any rule" in " ".join(keys.split())


def test_the_store_owns_the_sql_the_documents_say_it_does() -> None:
    """§9: callers never write SQL (the check is tests/fast/test_sql_in_store.py)."""
    row = next(line for line in section_text(9).splitlines()
               if line.startswith("| `inboxcrm.store` |"))
    assert "never write SQL" in row and "tests/fast/test_sql_in_store.py" in row
    assert (ROOT / "tests" / "fast" / "test_sql_in_store.py").exists()


PRINTING = ("inboxcrm/cli/", "deploy/bootstrap.py", "deploy/render_prometheusrule.py",
            "deploy/pin_hashes.py", "deploy/requirements.py", "tests/",
            "bench/")


def test_only_the_console_scripts_print() -> None:
    """CONTRIBUTING: no `print` in library code; only `inboxcrm/cli/` (and the
    deploy/bootstrap.py script) print. Checked on the syntax tree, not by ruff's `noqa`."""
    import ast
    import tomllib

    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if SKIP_DIRS & set(path.relative_to(ROOT).parts) or rel.startswith(PRINTING):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("print", "pprint")):
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"print outside the console scripts: {found}"
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "T20" in ruff["select"]
    ignored = {glob for glob, rules in ruff["per-file-ignores"].items() if "T20" in rules}
    assert ignored == {"tests/**", "bench/**", "inboxcrm/cli/**"}
    assert "print` in library code" in " ".join(_documents()["CONTRIBUTING.md"].split())


def test_the_patch_table_names_every_patch_of_the_workflow() -> None:
    """§5 "Workflow versions": one row per `workflow.patched` / `deprecate_patch` ID of the
    item workflow and of the mailbox watchers, with its number of sites, and the deprecated
    ones marked deprecated."""
    def named(module: Any) -> Callable[[re.Match[str]], str]:
        """A patch ID given by a named constant counts under its value."""
        return lambda m: f'{m[1]}("{getattr(module, m[2])}")'

    source = ""
    for name in ("inbound_email", "mailbox_gmail", "mailbox_graph", "mailbox_watch"):
        module = importlib.import_module(f"inboxcrm.workflows.{name}")
        source += re.sub(r"(workflow\.patched|workflow\.deprecate_patch)\(([A-Z_0-9]+)\)",
                         named(module),
                         (ROOT / "inboxcrm" / "workflows" / f"{name}.py").read_text())
    patched = re.findall(r'workflow\.patched\("([^"]+)"\)', source)
    deprecated = set(re.findall(r'workflow\.deprecate_patch\("([^"]+)"\)', source))
    rows = {m[0]: m[1] for m in re.findall(r"^\| `([a-z0-9.-]+)`[^|]*\| (\d+) ",
                                            section_text(5), re.M)}
    assert set(rows) == set(patched) | deprecated, rows
    for patch, sites in rows.items():
        count = patched.count(patch) + (1 if patch in deprecated else 0)
        assert int(sites) == count, f"{patch}: {sites} sites in §5, {count} in the code"
    for line in section_text(5).splitlines():
        for patch in deprecated:
            if line.startswith(f"| `{patch}`"):
                assert "**deprecated**" in line
