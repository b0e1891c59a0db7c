"""CONTRIBUTING's "Adding a destination adapter" names exactly the files a new provider
touches; these tests hold the recipe to the registry (inboxcrm/adapters/registry.py): the
files it names exist for every registered provider, each provider has its sandbox subset
and conformance test (or says why not), provider names are spelled only in their own
modules, and a provider module dropped into the package is all it takes to be usable from
the settings and from a tenant's policy."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from inboxcrm.adapters.registry import (
    CrmProvider,
    Provider,
    all_providers,
    register,
)
from tests.helpers.stack import ROOT

SECTION = "## Adding a destination adapter"
# The files the recipe's table names: <provider> stands for the provider's module name.
EXPECTED = [
    "inboxcrm/adapters/<provider>.py",
    "inboxcrm/sandbox/<provider>.py",
    "inboxcrm/sandbox/app.py",
    "tests/conformance/test_<provider>.py",
    "docs/architecture.md",
    "policies/README.md",
]
# Where a provider's name must not be spelled: the registry is the one place.
NAMELESS = ["inboxcrm/adapters/factory.py", "inboxcrm/adapters/registry.py",
            "inboxcrm/schemas/destinations.py"]


def _recipe() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    return text[start:text.index("\n## ", start + len(SECTION))]


def _table_files() -> list[str]:
    return re.findall(r"^\| `([^`]+)` \|", _recipe(), re.M)


def _module_path(provider: Provider[Any, Any]) -> Path:
    source = inspect.getsourcefile(type(provider))
    assert source is not None
    return Path(source).resolve()


def test_the_recipe_names_the_files_a_provider_touches() -> None:
    assert _table_files() == EXPECTED
    for path in _table_files():
        if "<provider>" not in path:
            assert (ROOT / path).is_file(), f"the recipe names {path}, which does not exist"
    # ... and says which files it no longer needs.
    for path in ("factory.py", "inboxcrm/schemas/destinations.py", "inboxcrm/platform/config.py",
                 "tests/test_adapters.py"):
        assert f"`{path}`" in _recipe().split("Nothing else:")[1].split("\n\n")[0]


@pytest.mark.parametrize("provider", all_providers(), ids=lambda p: f"{p.kind}:{p.name}")
def test_every_provider_has_its_files(provider: Provider[Any, Any]) -> None:
    module = _module_path(provider)
    assert module.parent == (ROOT / "inboxcrm" / "adapters").resolve()
    row = next(line for line in (ROOT / "docs/architecture.md").read_text().splitlines()
               if line.startswith("| `inboxcrm.adapters` |"))
    assert f"`{module.name}`" in row

    if provider.sandbox:
        app = (ROOT / "inboxcrm/sandbox/app.py").read_text(encoding="utf-8")
        for path in provider.sandbox:
            assert re.fullmatch(r"inboxcrm/sandbox/[a-z_]+\.py", path), path
            assert (ROOT / path).is_file(), f"{provider.name}: no sandbox subset {path}"
            stem = Path(path).stem
            assert re.search(rf"app\.include_router\({stem}\.\w+\)", app), (
                f"inboxcrm/sandbox/app.py does not include {path}'s router")
    else:
        assert provider.no_sandbox_reason, f"{provider.name}: no sandbox and no reason"

    if provider.conformance is not None:
        path = ROOT / provider.conformance
        assert path.parent == ROOT / "tests" / "conformance" and path.is_file(), (
            f"{provider.name}: no conformance test {provider.conformance}")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        tests = [node.name for node in ast.walk(tree)
                 if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                 and node.name.startswith("test_")]
        assert tests, f"{provider.conformance} holds no test"
    else:
        assert provider.no_conformance_reason, f"{provider.name}: no conformance, no reason"

    readme = (ROOT / "policies/README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines()
               if line.startswith(f"| `destinations.{provider.kind}.provider` |"))
    assert f"`{provider.name}`" in row, f"policies/README.md does not list {provider.name}"


def test_smtp_says_why_it_has_no_sandbox_and_no_conformance_test() -> None:
    smtp = next(p for p in all_providers() if p.name == "smtp")
    assert not smtp.sandbox and smtp.conformance is None
    assert "aiosmtpd" in (smtp.no_sandbox_reason or "")
    assert smtp.no_conformance_reason


@pytest.mark.parametrize("path", NAMELESS)
def test_provider_names_are_spelled_only_in_their_modules(path: str) -> None:
    text = (ROOT / path).read_text(encoding="utf-8")
    strings = {node.value for node in ast.walk(ast.parse(text))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    names = {p.name for p in all_providers()}
    assert not names & strings, f"{path} spells {sorted(names & strings)}"


def test_the_settings_spell_only_the_default_provider() -> None:
    tree = ast.parse((ROOT / "inboxcrm/platform/config.py").read_text(encoding="utf-8"))
    spelled = [node.value for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and node.value in {
                   p.name for p in all_providers()}]
    assert spelled == ["sandbox", "sandbox"]  # crm_provider's and mail_provider's default


def test_a_provider_without_its_sandbox_or_a_reason_is_refused() -> None:
    class Nameless(CrmProvider[Any]):
        name = "nameless"
        conformance = "tests/conformance/test_nameless.py"

        def from_settings(self, settings: Any) -> Any:
            raise NotImplementedError

        def from_destination(self, spec: Any, settings: Any, secrets: Any) -> Any:
            raise NotImplementedError

    with pytest.raises(TypeError, match="name its sandbox modules or say why"):
        register(Nameless)
    assert "nameless" not in {p.name for p in all_providers()}


# A provider written the way the recipe says, dropped into the package as its only file.
NEW_PROVIDER = '''
from __future__ import annotations

from typing import Any

from inboxcrm.adapters.registry import ConfigurationError, CrmProvider, Secrets, register
from inboxcrm.schemas.destinations import CrmDestination, SecretRef


class AcmeCrm:
    name = "acmecrm"

    def __init__(self, url: str, token: str | None) -> None:
        self.url, self.token = url, token


class AcmeDestination(CrmDestination):
    url: str
    token: SecretRef


@register
class AcmeProvider(CrmProvider[AcmeDestination]):
    name = AcmeCrm.name
    destination = AcmeDestination
    sandbox = ("inboxcrm/sandbox/acmecrm.py",)
    conformance = "tests/conformance/test_acmecrm.py"

    def from_settings(self, settings: Any) -> Any:
        if not settings.crm_url:
            raise ConfigurationError("INBOXCRM_CRM_URL is required for the acmecrm provider")
        return AcmeCrm(settings.crm_url, None)

    def from_destination(self, spec: AcmeDestination, settings: Any, secrets: Secrets) -> Any:
        return AcmeCrm(spec.url, secrets.get(spec.token, "token"))
'''

DRIVE = '''
import sys
import inboxcrm.adapters

inboxcrm.adapters.__path__.append(sys.argv[1])
from inboxcrm.adapters.factory import build_crm, build_tenant_crm
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.destinations import CrmDestination, TenantDestinations

assert "acmecrm" in CrmDestination.known(), CrmDestination.known()
client = build_crm(Settings(crm_provider="acmecrm", crm_url="https://acme.invalid"))
assert (type(client).__name__, client.url) == ("AcmeCrm", "https://acme.invalid")
spec = TenantDestinations.model_validate(
    {"crm": {"provider": "acmecrm", "url": "https://t.invalid",
             "token": {"env": "INBOXCRM_TENANT_NORTH_T"}}})
assert spec.crm is not None
tenant = build_tenant_crm("north", spec.crm, Settings(destination_hosts_allowed="t.invalid"))
assert (tenant.url, tenant.token) == ("https://t.invalid", "tenant-token")
try:
    TenantDestinations.model_validate({"crm": {"provider": "acmecrm", "url": "u",
                                               "token": "INLINE-VALUE"}})
except ValueError as exc:
    assert "never inline" in str(exc)
else:
    raise AssertionError("an inline token loaded")
print("ok")
'''


def test_a_new_provider_is_one_module(tmp_path: Path) -> None:
    """The module above, alone in a folder added to the package: the settings, a tenant's
    policy and the factory all know it, with nothing else edited."""
    (tmp_path / "acmecrm.py").write_text(textwrap.dedent(NEW_PROVIDER), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", DRIVE, str(tmp_path)], cwd=ROOT, capture_output=True,
        text=True, timeout=120, check=False,
        env={"INBOXCRM_TENANT_NORTH_T": "tenant-token", "PATH": "/usr/bin",
             "INBOXCRM_MAIL_FROM": "Acme <a@acme.invalid>", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
