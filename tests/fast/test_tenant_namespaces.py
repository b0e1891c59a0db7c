"""One Temporal namespace per tenant (docs/architecture.md §7, Namespaces): the operator's
INBOXCRM_TENANT_NAMESPACES as `namespace_for` reads it, and the start-up checks that refuse a
setting which would put two tenants in one namespace or name one that cannot exist."""

from __future__ import annotations

import pytest

from inboxcrm.ingress.codec import namespace_tenants
from inboxcrm.platform.codec import tenant_of_workflow
from inboxcrm.platform.config import Settings
from inboxcrm.platform.temporal import (
    NamespaceSettingError,
    namespace_for,
    namespace_for_workflow,
    parse_tenant_namespaces,
    tenant_namespaces,
    worker_namespaces,
)
from inboxcrm.stack.processes import temporal_dev_server_argv

TENANTS = ["acme", "globex", "initech"]


def test_empty_keeps_everyone_in_the_shared_namespace() -> None:
    settings = Settings(temporal_namespace="inbox")
    assert not tenant_namespaces(settings).per_tenant
    assert {namespace_for(settings, t) for t in TENANTS} == {"inbox"}
    assert namespace_for(settings, None) == "inbox"
    assert worker_namespaces(settings, TENANTS) == ["inbox"]
    assert tenant_namespaces(settings).check(TENANTS) == dict.fromkeys(TENANTS, "inbox")


def test_entries_then_template_then_shared() -> None:
    settings = Settings(temporal_namespace="default",
                        tenant_namespaces="acme=crm-acme, globex = crm-globex")
    assert [namespace_for(settings, t) for t in TENANTS] == ["crm-acme", "crm-globex",
                                                             "default"]
    templated = Settings(tenant_namespaces="inboxcrm-{tenant},initech=default")
    assert [namespace_for(templated, t) for t in TENANTS] == [
        "inboxcrm-acme", "inboxcrm-globex", "default"]
    assert worker_namespaces(templated, TENANTS) == ["default", "inboxcrm-acme",
                                                     "inboxcrm-globex"]


def test_a_workflow_lives_in_its_tenants_namespace() -> None:
    settings = Settings(tenant_namespaces="inboxcrm-{tenant}")
    item = "inbound/globex/standard/hello@globex.test/E-1"
    watcher = "mailbox/acme/imap/sales@acme.test/INBOX"
    assert tenant_of_workflow(item) == "globex"
    assert namespace_for_workflow(settings, item) == "inboxcrm-globex"
    assert namespace_for_workflow(settings, watcher) == "inboxcrm-acme"
    # The product's own Schedules (every tenant's) stay in the shared namespace.
    assert namespace_for_workflow(settings, "inboxcrm-drift-check") == "default"


@pytest.mark.parametrize("value", [
    "acme",                       # neither an entry nor a template
    "acme=",                      # no namespace
    "=crm-acme",                  # no tenant
    "acme=a,acme=b",              # one tenant twice
    "acme=has space",             # not a namespace name
    "acme=-leading",
    "x-{tenant},y-{tenant}",      # two templates
])
def test_malformed_settings_are_refused(value: str) -> None:
    with pytest.raises(NamespaceSettingError):
        parse_tenant_namespaces(value, "default")


def test_two_tenants_may_share_only_the_shared_namespace() -> None:
    clash = parse_tenant_namespaces("acme=crm,globex=crm", "default")
    with pytest.raises(NamespaceSettingError, match="share namespace 'crm'"):
        clash.check(TENANTS)
    shared = parse_tenant_namespaces("acme=default,globex=default,initech=own", "default")
    assert shared.check(TENANTS) == {"acme": "default", "globex": "default",
                                     "initech": "own"}


def test_an_entry_for_a_tenant_without_policy_is_refused() -> None:
    with pytest.raises(NamespaceSettingError, match="without a policy"):
        parse_tenant_namespaces("acmee=crm-acme", "default").check(TENANTS)


def test_a_template_that_makes_a_bad_name_is_refused_at_start() -> None:
    with pytest.raises(NamespaceSettingError, match="not a namespace name"):
        parse_tenant_namespaces("ns-{tenant}", "default").check(["bad tenant"])


def test_worker_namespaces_must_be_ones_in_use() -> None:
    settings = Settings(tenant_namespaces="inboxcrm-{tenant}",
                        worker_namespaces="inboxcrm-globex")
    assert worker_namespaces(settings, TENANTS) == ["inboxcrm-globex"]
    stray = Settings(tenant_namespaces="inboxcrm-{tenant}", worker_namespaces="other")
    with pytest.raises(NamespaceSettingError, match="no tenant uses"):
        worker_namespaces(stray, TENANTS)


def test_codec_knows_which_tenant_owns_a_namespace() -> None:
    mapping = parse_tenant_namespaces("acme=crm-acme,globex=default", "default")
    assert namespace_tenants(mapping, TENANTS) == {"crm-acme": frozenset({"acme"})}


def test_the_dev_server_creates_the_tenant_namespaces() -> None:
    argv = temporal_dev_server_argv(7233, None, None, namespaces=["inboxcrm-acme", "x"])
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("--namespace", "inboxcrm-acme") in pairs and ("--namespace", "x") in pairs
    assert "--namespace" not in temporal_dev_server_argv(7233, None, None)
