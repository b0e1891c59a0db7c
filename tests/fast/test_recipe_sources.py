"""CONTRIBUTING's "Adding an inbound source" names exactly the files the sources seam leaves,
and every registered source has what the recipe asks of it: its module, exporting its
source under its name, offline tests that import it, and deliveries over HTTP at each of its
paths."""

from __future__ import annotations

import re
from pathlib import Path

from inboxcrm.ingress.sources import source_class
from inboxcrm.ingress.sources.base import PushSource
from inboxcrm.platform.config import SOURCE_SECRETS, Settings
from inboxcrm.schemas.sources import SOURCE_NAMES

ROOT = Path(__file__).resolve().parents[2]
# What adding a push source touches in the product: its name, its module, its credentials
# (the shared route and the registry are not touched).
PRODUCT_FILES = {"inboxcrm/schemas/sources.py", "inboxcrm/ingress/sources/<name>.py",
                 "inboxcrm/platform/config.py"}
# What the recipe points at without asking for a change.
READ_ONLY = {"inboxcrm/ingress/sources/", "inboxcrm/ingress/sources/base.py",
             "inboxcrm/ingress/sources/postmark.py"}


def recipe() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    start = text.index("## Adding an inbound source")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def named_paths(text: str) -> set[str]:
    """Every repository path the text names in backticks (`dir/file.ext`, `dir/`)."""
    found = set()
    for quoted in re.findall(r"`([^`\s]+)`", text):
        if "/" in quoted and not quoted.startswith(("POST", "/", "http")):
            found.add(quoted)
    return found


def test_the_recipe_names_exactly_the_product_files_a_push_source_touches() -> None:
    named = {p for p in named_paths(recipe()) if p.startswith("inboxcrm/")}
    assert named >= PRODUCT_FILES, PRODUCT_FILES - named
    assert named <= PRODUCT_FILES | READ_ONLY, named - PRODUCT_FILES - READ_ONLY
    # The seam's promise: no mount line, no Literal, no hand-kept list to extend.
    for gone in ("inboxcrm/ingress/app.py", "inboxcrm/domain/policy.py",
                 "inboxcrm/domain/extraction/authentication.py", "inboxcrm/cli/extract.py"):
        assert gone not in named


def test_every_path_the_recipe_names_exists() -> None:
    for path in named_paths(recipe()):
        for name in SOURCE_NAMES if "<name>" in path else ("",):
            concrete = path.replace("<name>", name)
            assert (ROOT / concrete.rstrip("/")).exists(), f"the recipe names {concrete}"


def test_every_registered_source_has_its_module_credentials_and_tests() -> None:
    tests = {path: path.read_text() for path in (ROOT / "tests").rglob("test_*.py")}
    for name in SOURCE_NAMES:
        cls = source_class(name)
        assert issubclass(cls, PushSource) and cls.name == name
        assert name in SOURCE_SECRETS, f"{name}: no entry in config.SOURCE_SECRETS"
        module = f"inboxcrm.ingress.sources.{name}"
        offline = [p for p, text in tests.items() if module in text]
        assert offline, f"{name}: no test imports {module}"
        for route in cls(Settings(env="local")).paths:
            over_http = [p for p, text in tests.items()
                         if re.search(re.escape(route) + r"['\"]", text)]
            assert over_http, f"{name}: no test posts to {route}"


def test_no_push_source_module_is_left_unregistered() -> None:
    """A module exporting a push source under a name schemas.sources does not list would
    never be served."""
    import importlib

    for path in (ROOT / "inboxcrm/ingress/sources").glob("*.py"):
        if path.stem in ("__init__", "base"):
            continue
        exported = getattr(importlib.import_module(f"inboxcrm.ingress.sources.{path.stem}"),
                           "SOURCE", None)
        if isinstance(exported, type) and issubclass(exported, PushSource):
            assert exported.name == path.stem and path.stem in SOURCE_NAMES, path.name
