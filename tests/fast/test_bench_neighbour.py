"""The noisy-neighbour benchmark's pure pieces (bench/neighbour.py): tenant B's policy, the
latency bound and the destination count that says nothing was lost or duplicated."""

from __future__ import annotations

from pathlib import Path

from bench import neighbour
from inboxcrm.domain.policy import load_policies


def test_tenant_b_is_acme_on_its_own_mailbox_and_loads(tmp_path: Path) -> None:
    policies = load_policies(neighbour.write_policies(tmp_path / "policies"))
    beta, acme = policies["beta"], policies["acme"]
    assert beta.mailboxes != acme.mailboxes
    assert beta.followup_rules == acme.followup_rules


def test_the_bound_is_twice_alone_or_alone_plus_one_second() -> None:
    assert neighbour.target_p95_ms(200.0) == 1200.0
    assert neighbour.target_p95_ms(3000.0) == 6000.0


def test_destination_check_counts_lost_and_duplicated_per_tenant() -> None:
    senders = {"a1@example.com": "acme", "a2@example.com": "acme", "b1@example.com": "beta"}
    state = {
        "contacts": [{"properties": {"email": "a1@example.com"}},
                     {"properties": {"email": "A1@example.com"}},
                     {"properties": {"email": "b1@example.com"}},
                     {"properties": {"email": "other@example.com"}}],
        "emails": [{"to": ["a1@example.com"]}, {"to": ["b1@example.com"]},
                   {"to": ["b1@example.com"]}],
    }
    out = neighbour.destination_check(state, senders, {"acme": 1, "beta": 1})
    assert out["acme"] == {"senders": 2, "contacts_missing": 1, "contacts_duplicated": 1,
                           "followups_sent": 1, "followups_duplicated": 0,
                           "followups_expected": 1, "ok": False}
    assert out["beta"]["followups_duplicated"] == 1 and not out["beta"]["ok"]
    clean = {"contacts": [{"properties": {"email": a}} for a in senders],
             "emails": [{"to": [a]} for a in senders]}
    assert all(v["ok"] for v in neighbour.destination_check(
        clean, senders, {"acme": 2, "beta": 1}).values())


def test_a_intake_rate_is_written_into_tenant_a_policy_only(tmp_path: Path) -> None:
    policies = load_policies(neighbour.write_policies(tmp_path / "policies", a_intake=12.0))
    assert policies["acme"].capacity.intake_per_second == 12.0
    assert policies["acme"].capacity.intake_burst == 24
    assert policies["beta"].capacity.intake_per_second is None
