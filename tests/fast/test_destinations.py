"""Each tenant's own destinations (docs/architecture.md §5): the factory builds a tenant's CRM
and mail clients from its policy, resolves secrets by reference (never showing them), keeps
them per tenant and configuration, and uses the global ones for a tenant that names none.
That an item reaches only its tenant's account is proven on real sandboxes in
tests/test_tenant_destinations.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inboxcrm.adapters.factory import ConfigurationError, Destinations
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.resend import ResendMail
from inboxcrm.adapters.salesforce import SalesforceCrm
from inboxcrm.platform.config import Settings
from schemas.destinations import TenantDestinations


def _settings() -> Settings:
    return Settings(sandbox_url="http://global.invalid", crm_provider="sandbox",
                    mail_provider="sandbox")


def _url(client: object) -> str:
    return str(client._client.base_url).rstrip("/")  # type: ignore[attr-defined]


async def test_each_tenant_gets_its_own_accounts(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("NORTH_CRM_TOKEN", "north-crm-token")
    (tmp_path / "south-mail").write_text("south-mail-key\n", encoding="utf-8")
    specs = {
        "north": TenantDestinations.model_validate({
            "crm": {"provider": "sandbox", "url": "http://north.invalid",
                    "token": {"env": "NORTH_CRM_TOKEN"}},
            "mail": {"provider": "sandbox", "url": "http://north.invalid"}}),
        "south": TenantDestinations.model_validate({
            "crm": {"provider": "salesforce", "url": "http://south.invalid",
                    "oauth": {"client_id": "south-app",
                              "client_secret": {"file": str(tmp_path / "south-mail")}}},
            "mail": {"provider": "resend", "url": "http://south.invalid",
                     "token": {"file": str(tmp_path / "south-mail")}}}),
    }
    destinations = Destinations(_settings(), lambda t: specs.get(t, TenantDestinations()))
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
    monkeypatch.delenv("NORTH_MISSING", raising=False)
    spec = TenantDestinations.model_validate(
        {"mail": {"provider": "resend", "token": {"env": "NORTH_MISSING"}}})
    destinations = Destinations(_settings(), lambda t: spec)
    with pytest.raises(ConfigurationError) as info:
        destinations.mail("north")
    assert "tenant 'north'" in str(info.value)
    assert "environment variable NORTH_MISSING is empty or not set" in str(info.value)
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
