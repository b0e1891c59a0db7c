"""The rooms of docs/architecture.md §9: imports only go down, and no module imports itself
back through others. The contract lives in `.importlinter`; these tests prove it bites."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

from tests.helpers.stack import ROOT

PACKAGES = ("inboxcrm",)
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _copy_tree(dest: Path) -> None:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / ".importlinter", dest / ".importlinter")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_contract_holds_on_the_tree() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    """The store importing a workflow is the kind of shortcut the rooms exist to stop."""
    _copy_tree(tmp_path)
    ledger = tmp_path / "inboxcrm" / "store" / "ledger.py"
    ledger.write_text(ledger.read_text() + "\nimport inboxcrm.workflows.inbound_email  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "inboxcrm.store is not allowed to import inboxcrm.workflows" in result.stdout
    assert "inboxcrm.store.ledger -> inboxcrm.workflows.inbound_email" in result.stdout


def test_the_sandbox_stands_apart(tmp_path: Path) -> None:
    _copy_tree(tmp_path)
    core = tmp_path / "inboxcrm" / "sandbox" / "core.py"
    core.write_text(core.read_text() + "\nimport inboxcrm.schemas.models  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "inboxcrm.sandbox.core -> inboxcrm.schemas.models" in result.stdout


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(
                        graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_between_modules() -> None:
    graph = grimp.build_graph(*PACKAGES)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    """The check above could pass by never finding anything: show it finds a real cycle."""
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic import b\n")
    (package / "b.py").write_text("from cyclic import a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        graph = grimp.build_graph("cyclic", cache_dir=None)
    finally:
        sys.path.remove(str(tmp_path))
    assert _cycles(graph) == [["cyclic.a", "cyclic.b"]]
