"""Each tenant's own destinations (docs/architecture.md §5): the factory builds a tenant's CRM
and mail clients from its policy, resolves secrets by reference (never showing them), keeps
them per tenant and configuration, and uses the global ones for a tenant that names none.
That an item reaches only its tenant's account is proven on real sandboxes in
tests/test_tenant_destinations.py."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from inboxcrm.adapters.factory import ConfigurationError, Destinations, build_crm, build_mail
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.registry import Provider, all_providers, crm_provider
from inboxcrm.adapters.resend import ResendMail
from inboxcrm.adapters.salesforce import SalesforceCrm
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.destinations import (
    INLINE_SECRET,
    CrmDestination,
    MailDestination,
    SecretRef,
    TenantDestinations,
)
from tests.helpers.stack import ROOT


def _settings(**extra: Any) -> Settings:
    return Settings(sandbox_url="http://global.invalid", crm_provider="sandbox",
                    mail_provider="sandbox", destination_hosts_allowed="*.invalid", **extra)


def _url(client: object) -> str:
    return str(client._client.base_url).rstrip("/")  # type: ignore[attr-defined]


async def test_each_tenant_gets_its_own_accounts(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("INBOXCRM_TENANT_NORTH_CRM_TOKEN", "north-crm-token")
    (tmp_path / "south").mkdir()
    south_file = tmp_path / "south" / "mail"
    south_file.write_text("south-mail-key\n", encoding="utf-8")
    specs = {
        "north": TenantDestinations.model_validate({
            "crm": {"provider": "sandbox", "url": "http://north.invalid",
                    "token": {"env": "INBOXCRM_TENANT_NORTH_CRM_TOKEN"}},
            "mail": {"provider": "sandbox", "url": "http://north.invalid"}}),
        "south": TenantDestinations.model_validate({
            "crm": {"provider": "salesforce", "url": "http://south.invalid",
                    "oauth": {"client_id": "south-app",
                              "client_secret": {"file": str(south_file)}}},
            "mail": {"provider": "resend", "url": "http://south.invalid",
                     "token": {"file": str(south_file)}}}),
    }
    destinations = Destinations(_settings(tenant_secrets_dir=str(tmp_path)),
                                lambda t: specs.get(t, TenantDestinations()))
    try:
        north, south, other = (destinations.crm(t) for t in ("north", "south", "other"))
        assert isinstance(north, HubSpotCrm) and _url(north) == "http://north.invalid"
        assert north._client.headers["authorization"] == "Bearer north-crm-token"
        assert isinstance(south, SalesforceCrm) and _url(south) == "http://south.invalid"
        assert south._oauth is not None  # renews its own token
        assert isinstance(other, HubSpotCrm) and _url(other) == "http://global.invalid"
        south_mail = destinations.mail("south")
        assert isinstance(south_mail, ResendMail)
        assert south_mail._client.headers["authorization"] == "Bearer south-mail-key"
        assert _url(destinations.mail("other")) == "http://global.invalid"
        # Kept: the same client for the same tenant and configuration ...
        assert destinations.crm("north") is north and destinations.crm("other") is other
        # ... and a new one when the policy changes.
        specs["north"] = TenantDestinations.model_validate(
            {"crm": {"provider": "sandbox", "url": "http://north2.invalid"}})
        assert _url(destinations.crm("north")) == "http://north2.invalid"
    finally:
        await destinations.aclose()


def test_a_secret_that_resolves_to_nothing_names_where_it_looked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INBOXCRM_TENANT_NORTH_MISSING", raising=False)
    spec = TenantDestinations.model_validate(
        {"mail": {"provider": "resend", "token": {"env": "INBOXCRM_TENANT_NORTH_MISSING"}}})
    destinations = Destinations(_settings(), lambda t: spec)
    with pytest.raises(ConfigurationError) as info:
        destinations.mail("north")
    assert "tenant 'north'" in str(info.value)
    assert ("environment variable INBOXCRM_TENANT_NORTH_MISSING is empty or not set"
            in str(info.value))
    with pytest.raises(ConfigurationError):
        Destinations(_settings(), lambda t: TenantDestinations.model_validate(
            {"crm": {"provider": "hubspot", "token": {"file": "/nonexistent/token"}}})
                     ).crm("north")


@pytest.mark.parametrize(("spec", "problem"), [
    ({"crm": {"provider": "salesforce", "url": "https://x"}}, "needs oauth (or a token)"),
    ({"crm": {"provider": "hubspot"}}, "needs its token"),
    ({"crm": {"provider": "sandbox", "token": {"env": "A", "file": "/b"}}}, "exactly one"),
    ({"crm": {"provider": "sandbox", "token": {"file": "relative/path"}}}, "absolute path"),
    ({"mail": {"provider": "smtp"}}, "needs smtp_host"),
])
def test_incomplete_destinations_are_refused(spec: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        TenantDestinations.model_validate(spec)


# --- the registry's names and blocks (inboxcrm/adapters/registry.py) -----------------------
def test_an_unknown_provider_names_the_known_ones() -> None:
    with pytest.raises(ValueError) as info:
        TenantDestinations.model_validate({"crm": {"provider": "zoho"}})
    assert "unknown CRM provider 'zoho' (known: hubspot, pipedrive, salesforce, sandbox)" in str(
        info.value)
    with pytest.raises(ValueError, match=re.escape(
            "unknown mail provider 'postmark' (known: resend, sandbox, smtp)")):
        TenantDestinations.model_validate({"mail": {"provider": "postmark"}})
    with pytest.raises(ConfigurationError, match=re.escape(
            "INBOXCRM_CRM_PROVIDER must be one of hubspot, pipedrive, salesforce, sandbox, "
            "got 'zoho'")):
        build_crm(Settings(crm_provider="zoho"))
    with pytest.raises(ConfigurationError, match="INBOXCRM_MAIL_PROVIDER must be one of"):
        build_mail(Settings(mail_provider="mailchimp"))


@pytest.mark.parametrize(("spec", "field"), [
    ({"crm": {"provider": "sandbox", "oauth": {"client_id": "a",
                                               "client_secret": {"env": "B"}}}}, "oauth"),
    ({"crm": {"provider": "hubspot", "token": {"env": "T"}, "api_version": "62.0"}},
     "api_version"),
    ({"mail": {"provider": "resend", "token": {"env": "T"}, "smtp_host": "smtp.x"}},
     "smtp_host"),
    ({"mail": {"provider": "smtp", "smtp_host": "smtp.x", "url": "http://x"}}, "url"),
])
def test_a_block_takes_only_its_own_providers_fields(spec: dict[str, object],
                                                     field: str) -> None:
    with pytest.raises(ValueError) as info:
        TenantDestinations.model_validate(spec)
    assert field in str(info.value) and "Extra inputs are not permitted" in str(info.value)


def _secret_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, ...]]:
    """Paths to every SecretRef field of a block, nested blocks included."""
    paths: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        members = tuple(m for m in get_args(info.annotation) or (info.annotation,)
                        if m is not type(None))
        if members == (SecretRef,):  # `str | SecretRef` (a client ID) may be inline
            paths.append((name,))
        for member in members:
            if isinstance(member, type) and issubclass(member, BaseModel) \
                    and member is not SecretRef:
                paths += [(name, *sub) for sub in _secret_fields(member)]
    return paths


# Values for the fields a block's own validators tend to require, used where it has them.
LIKELY = {"url": "https://x.invalid", "token": {"env": "T"}, "smtp_host": "smtp.x.invalid"}


def _complete(provider: Provider[Any, Any]) -> dict[str, Any]:
    """A block of this provider that loads."""
    fields = provider.destination.model_fields
    block: dict[str, Any] = {"provider": provider.name}
    block |= {name: value for name, value in LIKELY.items() if name in fields}
    for name, info in fields.items():
        if name not in block and info.is_required():
            block[name] = {"env": "X"} if "SecretRef" in str(info.annotation) else "x"
    loaded = provider.destination.model_validate(block)  # fails loudly when it does not
    return loaded.model_dump(exclude_none=True)


@pytest.mark.parametrize("provider", all_providers(), ids=lambda p: f"{p.kind}:{p.name}")
def test_every_secret_field_of_every_provider_refuses_an_inline_value(
        provider: Provider[Any, Any]) -> None:
    """Whatever fields a provider's block declares, a SecretRef field takes a reference
    only, and the refusal never repeats the value."""
    paths = _secret_fields(provider.destination)
    assert paths, f"{provider.name} has no secret field to check"
    if provider.name == "salesforce":  # a nested block's secret is found too
        assert paths == [("token",), ("oauth", "client_secret")]
    for path in paths:
        block = _complete(provider)
        target = block
        for key in path[:-1]:
            target = target.setdefault(key, {"client_id": "app", "client_secret": {"env": "S"}})
        target[path[-1]] = "INLINE-SECRET-VALUE"
        with pytest.raises(ValueError) as info:
            TenantDestinations.model_validate({provider.kind: block})
        errors = info.value.errors()  # type: ignore[attr-defined]
        assert [(e["loc"], e["msg"]) for e in errors] == [
            ((provider.kind, *path), f"Value error, {INLINE_SECRET}")]
        assert "INLINE-SECRET-VALUE" not in " ".join(str(e["msg"]) for e in errors)


def test_a_block_dumps_as_its_provider_and_loads_back() -> None:
    spec = TenantDestinations.model_validate({
        "crm": {"provider": "salesforce", "url": "https://x.my.salesforce.com",
                "oauth": {"client_id": "app", "client_secret": {"env": "S"}},
                "external_id_field": "Our_Id__c"},
        "mail": {"provider": "smtp", "smtp_host": "smtp.x", "smtp_port": 465,
                 "smtp_tls": "ssl"}})
    dumped = spec.model_dump(mode="json")
    assert dumped["crm"]["external_id_field"] == "Our_Id__c"
    assert dumped["mail"]["smtp_tls"] == "ssl"
    assert TenantDestinations.model_validate(dumped) == spec


def test_a_providers_block_refuses_another_providers_name() -> None:
    salesforce = crm_provider("salesforce").destination
    with pytest.raises(ValueError, match="provider must be 'salesforce'"):
        salesforce.model_validate({"provider": "hubspot", "url": "https://x",
                                   "token": {"env": "T"}})


def test_a_name_is_registered_once() -> None:
    hubspot = crm_provider("hubspot").destination
    with pytest.raises(TypeError, match="registered twice"):
        CrmDestination.register("salesforce", hubspot)
    with pytest.raises(TypeError, match="is not a mail provider's destination"):
        MailDestination.register("hubspot", hubspot)


def test_a_policy_pickled_to_a_work_pool_child_imports_no_adapter() -> None:
    """A tenant's policy goes to the work-pool child with every message it extracts; the
    child must not import the adapters inside that budgeted call to unpickle its block. The
    worker's own process, which has them, gets the provider's model back."""
    spec = TenantDestinations.model_validate({
        "crm": {"provider": "salesforce", "url": "https://x.my.salesforce.com",
                "token": {"env": "T"}},
        "mail": {"provider": "smtp", "smtp_host": "smtp.x"}})
    blob = pickle.dumps(spec)
    assert pickle.loads(blob) == spec
    child = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; spec = pickle.loads(sys.stdin.buffer.read());"
         "print(type(spec.crm).__name__, spec.crm.provider, spec.mail.provider,"
         " 'inboxcrm.adapters' in sys.modules)"],
        input=blob, capture_output=True, timeout=60, check=True, cwd=ROOT)
    assert child.stdout.decode().split() == ["CrmDestination", "salesforce", "smtp", "False"]


async def test_endpoints_say_where_each_tenant_s_calls_go_without_secrets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker reports for `inboxcrm rehearse`'s guard: provider and base URL per
    tenant, the global accounts for a tenant without its own, and `unavailable` (no URL)
    for a destination that cannot be built; never a token."""
    monkeypatch.setenv("INBOXCRM_TENANT_NORTH_CRM_TOKEN", "north-crm-token")
    monkeypatch.delenv("INBOXCRM_TENANT_SOUTH_MISSING", raising=False)
    specs = {
        "north": TenantDestinations.model_validate({
            "crm": {"provider": "sandbox", "url": "http://north.invalid",
                    "token": {"env": "INBOXCRM_TENANT_NORTH_CRM_TOKEN"}}}),
        "south": TenantDestinations.model_validate({
            "mail": {"provider": "resend", "token": {"env": "INBOXCRM_TENANT_SOUTH_MISSING"}}}),
    }
    destinations = Destinations(_settings(), lambda t: specs.get(t, TenantDestinations()))
    try:
        north, south = destinations.endpoints("north"), destinations.endpoints("south")
    finally:
        await destinations.aclose()
    assert (north.crm_provider, north.crm_url.rstrip("/")) == ("hubspot", "http://north.invalid")
    assert (north.mail_provider, north.mail_url.rstrip("/")) == ("resend",
                                                                 "http://global.invalid")
    assert (south.mail_provider, south.mail_url) == ("unavailable", "")
    assert "north-crm-token" not in repr(north)
