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
