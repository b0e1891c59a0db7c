"""The chaos run's plan (inboxcrm/verify/chaos.py): the senders it seeds as pre-existing CRM
records are new senders of the run, a stable share per seed, and seeding them leaves the
deliveries and their schedule as they were (a random stream of its own)."""

from __future__ import annotations

from inboxcrm.verify.chaos import ChaosConfig, plan_deliveries, plan_existing


def test_seeded_senders_are_new_senders_of_the_run_and_stable_per_seed() -> None:
    config = ChaosConfig(events=400, seed=7)
    deliveries, schedule = plan_deliveries(config, "run1")
    seeded = plan_existing(config, deliveries)
    new = {d.email: d.name for d in deliveries if d.kind == "new"}
    assert seeded and all(new.get(p.email) == p.name for p in seeded)
    assert len({p.email for p in seeded}) == len(seeded)
    assert 0.05 * len(new) <= len(seeded) <= 0.15 * len(new)
    assert [p.email for p in plan_existing(config, deliveries)] == [p.email for p in seeded]


def test_seeding_leaves_the_deliveries_and_schedule_unchanged() -> None:
    with_seeding = ChaosConfig(events=200, seed=3)
    without = ChaosConfig(events=200, seed=3, existing_ratio=0.0)
    first = plan_deliveries(with_seeding, "r")
    second = plan_deliveries(without, "r")
    assert [(d.delivery_id, d.kind, d.email, d.name) for d in first[0]] == [
        (d.delivery_id, d.kind, d.email, d.name) for d in second[0]]
    assert [(at, d.delivery_id) for at, d in first[1]] == [(at, d.delivery_id)
                                                           for at, d in second[1]]
    assert plan_existing(without, second[0]) == []


def test_each_crm_the_run_can_use_is_a_setting_the_worker_takes() -> None:
    """`--crm` turns the stack's tenants to that CRM's surface of the sandbox through the
    global settings; the worker builds that adapter from them (its `from_settings`)."""
    import asyncio
    from unittest import mock

    import pytest

    from inboxcrm.adapters.registry import crm_provider
    from inboxcrm.platform.config import Settings
    from inboxcrm.verify.chaos import CRMS, crm_env, crm_view

    assert crm_env("hubspot", "http://127.0.0.1:1") == {}
    for crm in ("salesforce", "pipedrive"):
        env = crm_env(crm, "http://127.0.0.1:1")
        with mock.patch.dict("os.environ", env):
            settings = Settings()
        assert settings.crm_provider == crm
        client = crm_provider(crm).from_settings(settings)
        assert client.name == crm
        asyncio.run(client.aclose())
    assert crm_view("salesforce").id_property == "Inboxcrm_Contact_Id__c"
    assert crm_view("pipedrive", "f" * 40).note_actions == ("crm-note", "crm-email",
                                                            "crm-sent")
    assert set(CRMS) == {"hubspot", "salesforce", "pipedrive"}
    with pytest.raises(ValueError, match="unknown CRM"):
        crm_env("zoho", "http://127.0.0.1:1")
    with pytest.raises(ValueError, match="custom field"):
        crm_view("pipedrive")
