"""Secrets stay with their tenant, and destinations stay on their provider's hosts (issue
36, docs/architecture.md §7): a tenant policy naming another tenant's or the worker's
secret, plain http, a host its provider does not document, or an internal address is refused
when it loads, in one line naming the rule and never a secret's value; the adapters refuse
internal addresses again after DNS resolution, at connect time. And keys by purpose: the
decision secret is held to the 32-byte rule and is never itself a key."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from inboxcrm.adapters.factory import ConfigurationError, Destinations
from inboxcrm.domain.policy import PolicyError, load_policies
from inboxcrm.platform.config import InsecureSetting, Settings
from inboxcrm.platform.reviewer_identity import (
    DecisionClaim,
    derived_key,
    sign_decision,
    verify_decision,
)
from inboxcrm.schemas.destinations import TenantDestinations

SECRET_VALUE = "the-desk-master-secret-0123456789abcdef"


def _policy(directory: Path, tenant: str, destinations: dict[str, Any]) -> None:
    name = tenant.replace("_", "-")
    data = {"tenant": tenant, "mailboxes": [f"sales@{name}{len(tenant)}.test"],
            "domains": [f"{name}.test"], "destinations": destinations}
    (directory / f"{tenant}.json").write_text(json.dumps(data), encoding="utf-8")


def _refusal(directory: Path) -> str:
    with pytest.raises(PolicyError) as info:
        load_policies(directory)
    message = str(info.value)
    assert "\n" not in message and SECRET_VALUE not in message
    return message


@pytest.fixture(autouse=True)
def _operator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator allows nothing beyond the documented hosts; the secret is set (so a
    message that repeated it would show)."""
    monkeypatch.delenv("INBOXCRM_DESTINATION_HOSTS_ALLOWED", raising=False)
    monkeypatch.delenv("INBOXCRM_TENANT_SECRETS_DIR", raising=False)
    monkeypatch.setenv("INBOXCRM_DECISION_SECRET", SECRET_VALUE)
    monkeypatch.setenv("INBOXCRM_TENANT_SOUTH_TOKEN", "south's own")


@pytest.mark.parametrize(("token", "rule"), [
    ({"env": "INBOXCRM_DECISION_SECRET"}, "environment variable INBOXCRM_DECISION_SECRET"),
    ({"env": "DATABASE_URL"}, "environment variable DATABASE_URL"),
    ({"env": "INBOXCRM_TENANT_SOUTH_TOKEN"}, "INBOXCRM_TENANT_SOUTH_TOKEN"),
    ({"env": "INBOXCRM_TENANT_NORTH_"}, "INBOXCRM_TENANT_NORTH_"),
    ({"file": "/var/run/secrets/codec-keys.json"}, "file /var/run/secrets/codec-keys.json"),
])
def test_a_secret_outside_the_tenants_namespace_is_refused_at_load(
        tmp_path: Path, token: dict[str, str], rule: str) -> None:
    _policy(tmp_path, "north", {"mail": {"provider": "resend", "token": token}})
    message = _refusal(tmp_path)
    assert "north.json" in message and "destinations.mail.token" in message and rule in message
    assert "outside the tenant's namespace" in message
    assert "INBOXCRM_TENANT_NORTH_* variables" in message


def test_a_file_outside_the_tenants_directory_is_refused(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    secrets, policies = tmp_path / "secrets", tmp_path / "policies"
    for folder in (secrets / "north", secrets / "south", policies):
        folder.mkdir(parents=True)
    (secrets / "south" / "token").write_text("south's own\n", encoding="utf-8")
    (secrets / "north" / "token").write_text("north's own\n", encoding="utf-8")
    os.symlink(secrets / "south" / "token", secrets / "north" / "link")
    monkeypatch.setenv("INBOXCRM_TENANT_SECRETS_DIR", str(secrets))
    for path in (secrets / "south" / "token", f"{secrets}/north/../south/token",
                 secrets / "north" / "link"):
        _policy(policies, "north", {"crm": {"provider": "hubspot",
                                            "token": {"file": str(path)}}})
        assert "outside the tenant's namespace" in _refusal(policies)
    _policy(policies, "north", {"crm": {"provider": "hubspot",
                                        "token": {"file": str(secrets / "north" / "token")}}})
    assert load_policies(policies)["north"].destinations.crm is not None
    # A link made after the policy loaded is followed when the secret is read: refused.
    (secrets / "north" / "token").unlink()
    os.symlink(secrets / "south" / "token", secrets / "north" / "token")
    spec = load_policies(policies)["north"].destinations  # cached: the policy did not change
    settings = Settings(tenant_secrets_dir=str(secrets))
    with pytest.raises(ConfigurationError, match="outside the tenant's namespace"):
        Destinations(settings, lambda t: spec).crm("north")


@pytest.mark.parametrize(("block", "rule"), [
    ({"provider": "hubspot", "url": "http://api.hubapi.com"}, "http:// to api.hubapi.com"),
    ({"provider": "hubspot", "url": "https://collector.attacker.example"},
     "host collector.attacker.example is not one the provider documents (api.hubapi.com)"),
    ({"provider": "hubspot", "url": "https://169.254.169.254/latest"},
     "169.254.169.254 is a private, loopback or link-local address"),
    ({"provider": "hubspot", "url": "https://127.0.0.1:8090"}, "127.0.0.1 is a private"),
    ({"provider": "hubspot", "url": "https://10.1.2.3"}, "10.1.2.3 is a private"),
    ({"provider": "hubspot", "url": "https://[::ffff:10.0.0.1]"}, "is a private"),
    ({"provider": "hubspot", "url": "https://user:pw@api.hubapi.com"}, "credentials in a URL"),
    ({"provider": "sandbox", "url": "http://127.0.0.1:8090"}, "127.0.0.1 is a private"),
    ({"provider": "salesforce", "url": "https://evil.example",
      "oauth": {"client_id": "a", "client_secret": {"env": "INBOXCRM_TENANT_NORTH_S"}}},
     "host evil.example is not one the provider documents (*.my.salesforce.com"),
    ({"provider": "salesforce", "url": "https://north.my.salesforce.com",
      "oauth": {"client_id": "a", "client_secret": {"env": "INBOXCRM_TENANT_NORTH_S"},
                "token_url": "https://metadata.google.internal/token"}},
     "destinations.crm.oauth.token_url: host metadata.google.internal"),
])
def test_an_endpoint_off_the_providers_https_hosts_is_refused(
        tmp_path: Path, block: dict[str, Any], rule: str) -> None:
    block.setdefault("token", {"env": "INBOXCRM_TENANT_NORTH_TOKEN"})
    if block["provider"] == "salesforce":
        block.pop("token")
    _policy(tmp_path, "north", {"crm": block})
    message = _refusal(tmp_path)
    assert rule in message
    assert "credentials" in rule or "INBOXCRM_DESTINATION_HOSTS_ALLOWED" in message


def test_an_smtp_server_needs_the_operators_leave(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _policy(tmp_path, "north", {"mail": {"provider": "smtp", "smtp_host": "smtp.north.test"}})
    assert "host smtp.north.test is not one the provider documents" in _refusal(tmp_path)
    monkeypatch.setenv("INBOXCRM_DESTINATION_HOSTS_ALLOWED", "smtp.north.test")
    assert load_policies(tmp_path)["north"].destinations.mail is not None


def test_documented_hosts_and_operator_allowed_ones_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _policy(tmp_path, "north", {
        "crm": {"provider": "salesforce", "url": "https://north.my.salesforce.com",
                "oauth": {"client_id": "a",
                          "client_secret": {"env": "INBOXCRM_TENANT_NORTH_SF"},
                          "token_url": "https://login.salesforce.com/services/oauth2/token"}},
        "mail": {"provider": "resend", "token": {"env": "INBOXCRM_TENANT_NORTH_RESEND"}}})
    _policy(tmp_path, "south", {"crm": {"provider": "sandbox", "url": "http://127.0.0.1:8090",
                                        "token": {"env": "INBOXCRM_TENANT_SOUTH_TOKEN"}}})
    assert "127.0.0.1 is a private" in _refusal(tmp_path)
    monkeypatch.setenv("INBOXCRM_DESTINATION_HOSTS_ALLOWED", "127.0.0.1, localhost")
    assert sorted(load_policies(tmp_path)) == ["north", "south"]


def test_tenants_sharing_a_namespace_are_refused(tmp_path: Path) -> None:
    _policy(tmp_path, "a-b", {})
    _policy(tmp_path, "a_b", {})
    message = _refusal(tmp_path)
    assert "share the namespace A_B" in message


async def test_a_name_resolving_to_an_internal_address_is_refused_at_connect() -> None:
    """`localhost` is no documented host, so it can only come from the operator's list by
    another name; here the rule is applied as the transport applies it after resolution:
    the request is never sent and the refusal is permanent."""
    from inboxcrm.adapters.base import AdapterError
    from inboxcrm.adapters.hubspot import HubSpotCrm
    from inboxcrm.adapters.transport import AddressGuard
    from inboxcrm.schemas.destinations import DestinationRules

    for url in ("http://localhost:9", "http://127.0.0.1:9", "http://169.254.169.254",
                "http://10.0.0.1:9"):
        crm = HubSpotCrm(url, "token", "inboxcrm_contact_id", 2,
                         guard=AddressGuard(DestinationRules()))
        try:
            with pytest.raises(AdapterError) as info:
                await crm.find_contact("x")
        finally:
            await crm.aclose()
        assert info.value.classified.reason == "destination_address_refused", url


def test_a_destination_built_with_a_refused_spec_never_sends(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    spec = TenantDestinations.model_validate({"mail": {
        "provider": "resend", "url": "https://collector.attacker.example",
        "token": {"env": "INBOXCRM_DECISION_SECRET"}}})
    with pytest.raises(ConfigurationError) as info:
        Destinations(Settings(), lambda t: spec).mail("north")
    assert SECRET_VALUE not in str(info.value) and "outside the tenant's namespace" in str(
        info.value)


# --- keys by purpose -------------------------------------------------------------------------
def test_a_short_decision_secret_refuses_to_start() -> None:
    with pytest.raises(InsecureSetting, match="INBOXCRM_DECISION_SECRET is shorter than 32"):
        Settings(env="production", decision_secret="changeme", mail_from="S <s@x.test>")
    Settings(env="local", decision_secret="changeme")  # the local stack may
    Settings(env="production", decision_secret="x" * 32, mail_from="S <s@x.test>")


def test_sessions_csrf_and_proofs_each_have_their_own_key() -> None:
    keys = {p: derived_key(SECRET_VALUE, p)
            for p in ("review-session", "review-csrf", "decision-proof")}
    assert len(set(keys.values())) == 3 and SECRET_VALUE.encode() not in keys.values()
    assert all(len(k) == 32 for k in keys.values())
    claim = DecisionClaim("reviewer:dana", "desk", "wf", "w1", "approve")
    proof = sign_decision(SECRET_VALUE, claim)
    import hashlib
    import hmac
    keyed_by_secret = "v2:" + hmac.new(SECRET_VALUE.encode(), claim.message(),
                                       hashlib.sha256).hexdigest()
    assert proof != keyed_by_secret  # the secret itself is not the proof key
    assert verify_decision(SECRET_VALUE, proof, claim)
    assert not verify_decision(SECRET_VALUE, keyed_by_secret, claim)


async def test_an_smtp_server_resolving_to_an_internal_address_is_never_connected() -> None:
    from inboxcrm.adapters.base import AdapterError, OutgoingEmail
    from inboxcrm.adapters.smtp import SmtpMail
    from inboxcrm.adapters.transport import AddressGuard
    from inboxcrm.schemas.destinations import DestinationRules

    mail = SmtpMail("localhost", 9, sender="North <sales@north.test>", security="none",
                    timeout=2, guard=AddressGuard(DestinationRules()))
    with pytest.raises(AdapterError) as info:
        await mail.send("k1", OutgoingEmail(to="ada@example.com", subject="s", text="t"))
    assert info.value.classified.reason == "destination_address_refused"
