from __future__ import annotations

import json
from pathlib import Path

import pytest

from inboxcrm.domain import policy as policy_module
from inboxcrm.domain.policy import (
    InvalidAddress,
    PolicyError,
    TenantPolicy,
    UnknownTenant,
    canonical_email,
    get_policy,
    load_policies,
    policy_dir,
    tenant_for_mailbox,
)
from inboxcrm.schemas.extraction import INTENTS

ROOT = Path(__file__).resolve().parents[3]


def test_demo_tenant_acme(acme: TenantPolicy) -> None:
    assert policy_dir() == ROOT / "policies"
    assert acme.tenant == "acme"
    assert acme.mailboxes == ["sales@acme.test"]
    assert acme.domains == ["acme.test"]
    assert not acme.identity.fold_dots and not acme.identity.fold_plus
    assert acme.updatable_fields == ["name", "company"]
    assert acme.review_on_conflict == ["name"]
    assert acme.review_owner == "sales-ops"
    [rule] = acme.followup_rules
    assert (rule.rule_id, rule.version, rule.template_id) == ("ack", 1, "ack")
    assert set(acme.template_for(rule).languages) >= {"en"}
    assert rule.quiet_period_hours == 24 and rule.new_prospect_requires_approval is False
    assert set(rule.intents) == set(INTENTS) - {"opt_out", "complaint"}
    assert acme.rule_for_intent("pricing_request") is rule
    assert acme.rule_for_intent("opt_out") is None
    assert acme.thresholds.sender_email == 0.8


def test_tenant_for_mailbox(acme: TenantPolicy) -> None:
    assert tenant_for_mailbox("sales@acme.test") == "acme"
    assert tenant_for_mailbox("SALES@ACME.TEST") == "acme"
    assert tenant_for_mailbox("other@acme.test") is None
    assert tenant_for_mailbox("not an address") is None


def test_unknown_tenant(acme: TenantPolicy) -> None:
    with pytest.raises(UnknownTenant) as info:
        get_policy("nobody")
    assert isinstance(info.value, LookupError)
    assert "nobody" in str(info.value)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("Jane.Doe@Initech.Example", "jane.doe@initech.example"),
        ("  jane@initech.example ", "jane@initech.example"),
        ("jane+crm@initech.example", "jane+crm@initech.example"),  # no plus folding
        ("j.a.n.e@initech.example", "j.a.n.e@initech.example"),  # no dot folding
        ("joerg@MÜLLER-bau.de", "joerg@müller-bau.de"),
        ("joerg@xn--mller-bau-q9a.de", "joerg@müller-bau.de"),  # IDNA -> normalised form
        ("JÜRGEN@stahl.example", "jürgen@stahl.example"),
        ("sales@acme.test", "sales@acme.test"),
    ],
)
def test_canonical_email_default(acme: TenantPolicy, address: str, expected: str) -> None:
    assert canonical_email(address, acme) == expected


def test_folding_only_on_opt_in(acme: TenantPolicy) -> None:
    folded = acme.model_copy(update={"identity": acme.identity.model_copy(
        update={"fold_dots": True, "fold_plus": True})})
    assert canonical_email("J.Doe+news@Gmail.com", folded) == "jdoe@gmail.com"
    plus_only = acme.model_copy(update={"identity": acme.identity.model_copy(
        update={"fold_plus": True})})
    assert canonical_email("j.doe+news@gmail.com", plus_only) == "j.doe@gmail.com"
    assert canonical_email("j.doe+news@gmail.com", acme) == "j.doe+news@gmail.com"


@pytest.mark.parametrize(
    "address",
    ["", "jane", "jane@", "@initech.example", "jane@localhost", "jane@@x.example",
     "Jane <jane@initech.example>", "jane@initech..example", "a" * 400 + "@x.example",
     "jane doe@initech.example", "\x00@x.example"],
)
def test_invalid_address_never_echoed(acme: TenantPolicy, address: str) -> None:
    with pytest.raises(InvalidAddress) as info:
        canonical_email(address, acme)
    assert isinstance(info.value, ValueError)
    if address.strip():
        assert address not in str(info.value)
        assert "initech" not in str(info.value)


def _write(directory: Path, name: str, data: object) -> Path:
    path = directory / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def _templates(directory: Path, tenant: str, name: str) -> None:
    """A minimal valid template for a test tenant's rule."""
    folder = directory / tenant / "templates"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.en.subject").write_text("Thanks\n", encoding="utf-8")
    (folder / f"{name}.en.txt").write_text(
        "Hi {{ first_name or 'there' }}\n{{ postal_address }}\n{{ opt_out_url }}\n",
        encoding="utf-8")


def _policy_data(tenant: str = "beta") -> dict[str, object]:
    return {
        "tenant": tenant, "mailboxes": ["inbox@beta.example"], "domains": ["beta.example"],
        "identity": {"fold_dots": False, "fold_plus": True},
        "updatable_fields": ["company"], "review_on_conflict": ["name", "company"],
        "followup_rules": [{"rule_id": "welcome", "version": 3, "intents": ["demo_request"],
                            "quiet_period_hours": 48, "new_prospect_requires_approval": True,
                            "template_id": "welcome"}],
        "thresholds": {"sender_email": 0.9, "contact_name": 0.6, "company": 0.6},
        "sender": {"postal_address": "Beta Ltd., 2 Beta Road, Betatown"},
    }


def test_policy_dir_env_json_and_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, "beta.json", _policy_data())
    _templates(tmp_path, "beta", "welcome")
    _templates(tmp_path, "gamma", "ack")
    _write(tmp_path, "gamma.toml", """
tenant = "gamma"
mailboxes = ["hello@gamma.example"]
domains = ["gamma.example"]
updatable_fields = ["name"]
review_on_conflict = []

[identity]
fold_dots = true

[sender]
postal_address = "Gamma GmbH, Gammaweg 3, 12345 Gammastadt"

[[followup_rules]]
rule_id = "ack"
version = 1
intents = ["pricing_request"]

[thresholds]
sender_email = 0.85
""")
    monkeypatch.setenv("INBOXCRM_POLICY_DIR", str(tmp_path))
    assert policy_dir() == tmp_path
    policies = load_policies()
    assert sorted(policies) == ["beta", "gamma"]
    beta = get_policy("beta")
    assert beta.identity.fold_plus and beta.followup_rules[0].new_prospect_requires_approval
    assert canonical_email("x+y@beta.example", beta) == "x@beta.example"
    gamma = get_policy("gamma")
    assert gamma.identity.fold_dots and gamma.thresholds.sender_email == 0.85
    assert gamma.followup_rules[0].quiet_period_hours == 24
    assert tenant_for_mailbox("hello@gamma.example") == "gamma"
    assert gamma.is_own_domain("x@mail.gamma.example")
    assert not gamma.is_own_domain("x@notgamma.example")


@pytest.mark.parametrize(
    ("mutation", "message_part"),
    [
        ({"followup_rules": [{"rule_id": "ack", "version": 1, "intents": ["bogus"]}]},
         "unknown intents"),
        ({"updatable_fields": ["email"]}, "unknown fields"),
        ({"mailboxes": ["not-an-address"]}, "mailboxes"),
        ({"thresholds": {"sender_email": 2}}, "thresholds.sender_email"),
        ({"surprise": True}, "surprise"),
        ({"tenant": "other"}, "does not match the file name"),
    ],
)
def test_invalid_policy_names_the_file(
    tmp_path: Path, mutation: dict[str, object], message_part: str
) -> None:
    data = _policy_data() | mutation
    _write(tmp_path, "beta.json", data)
    _templates(tmp_path, "beta", "welcome")
    with pytest.raises(PolicyError) as info:
        load_policies(tmp_path)
    assert "beta.json" in str(info.value)
    assert message_part in str(info.value)


def test_unparseable_policy_names_the_file(tmp_path: Path) -> None:
    _write(tmp_path, "beta.json", "{ not json")
    with pytest.raises(PolicyError, match="beta.json"):
        load_policies(tmp_path)
    (tmp_path / "beta.json").unlink()
    _write(tmp_path, "beta.toml", "tenant = ")
    with pytest.raises(PolicyError, match="beta.toml"):
        load_policies(tmp_path)


def test_policy_cache_sees_changes(tmp_path: Path) -> None:
    path = _write(tmp_path, "beta.json", _policy_data())
    _templates(tmp_path, "beta", "welcome")
    assert load_policies(tmp_path)["beta"].review_owner == "sales-ops"
    data = _policy_data() | {"review_owner": "team-b"}
    path.write_text(json.dumps(data) + "\n" * 3, encoding="utf-8")
    assert load_policies(tmp_path)["beta"].review_owner == "team-b"
    assert policy_module.PolicyError is PolicyError


def test_every_shipped_policy_loads() -> None:
    policies = load_policies(ROOT / "policies")
    assert "acme" in policies
