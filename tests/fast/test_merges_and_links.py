"""The pure parts of changes of address and merges (issue 35): which contact a link keeps
(`inboxcrm contact link`), and what the sandbox's HubSpot merge leaves on the survivor."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from inboxcrm.sandbox.merges import _merged_properties
from inboxcrm.store.contact_links import LinkRefused, _choose, refuse_unequal_consent

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _contact(name: str, email: str, record: str | None = None,
             age_days: int = 0) -> dict[str, Any]:
    return {"contact_id": name, "canonical_email": email, "crm_record_id": record,
            "created_at": T0 - timedelta(days=age_days)}


def test_the_address_without_a_contact_is_linked_to_the_one_with() -> None:
    a = _contact("ca", "a@x.example")
    assert _choose([a, None], "a@x.example", "b@x.example") == (a, None, "b@x.example")
    assert _choose([None, a], "b@x.example", "a@x.example") == (a, None, "b@x.example")


def test_neither_address_with_a_contact_is_refused() -> None:
    with pytest.raises(LinkRefused, match="neither address has a contact"):
        _choose([None, None], "a@x.example", "b@x.example")


def test_two_contacts_with_records_of_their_own_are_refused_with_what_to_do() -> None:
    a, b = _contact("ca", "a@x.example", "101"), _contact("cb", "b@x.example", "102")
    with pytest.raises(LinkRefused, match="merge the two records in the CRM first"):
        _choose([a, b], "a@x.example", "b@x.example")


def test_of_two_contacts_the_one_with_the_record_is_kept() -> None:
    a, b = _contact("ca", "a@x.example"), _contact("cb", "b@x.example", "102")
    assert _choose([a, b], "a@x.example", "b@x.example") == (b, a, "a@x.example")
    assert _choose([b, a], "b@x.example", "a@x.example") == (b, a, "a@x.example")


def test_of_two_contacts_without_records_the_older_is_kept() -> None:
    young, old = _contact("ca", "a@x.example"), _contact("cb", "b@x.example", age_days=3)
    assert _choose([young, old], "a@x.example", "b@x.example") == (old, young, "a@x.example")


def test_two_contacts_sharing_one_record_are_not_refused() -> None:
    a, b = _contact("ca", "a@x.example", "101"), _contact("cb", "b@x.example", "101")
    kept, other, alias = _choose([a, b], "a@x.example", "b@x.example")
    assert (kept, other, alias) == (a, b, "b@x.example")


def test_a_hubspot_merge_keeps_the_primarys_values_and_records_the_merged_id() -> None:
    keep = {"email": "b@x.example", "lastname": "Kept", "company": ""}
    gone = {"email": "a@x.example", "lastname": "Gone", "company": "Acme",
            "hs_merged_object_ids": "99"}
    out = _merged_properties("hubspot", keep, gone, 101)
    assert out["email"] == "b@x.example" and out["lastname"] == "Kept"
    assert out["company"] == "Acme"  # an empty primary value is filled
    assert out["hs_merged_object_ids"] == "99;101"
    assert out["hs_additional_emails"] == "a@x.example"


def test_a_salesforce_merge_keeps_the_masters_fields() -> None:
    keep = {"email": "b@x.example", "lastname": "Master"}
    assert _merged_properties("salesforce", keep, {"email": "a@x.example"}, 7) == keep


def test_a_link_between_an_opted_out_address_and_another_is_refused() -> None:
    both = ["a@x.example", "b@x.example"]
    refuse_unequal_consent({}, both)
    refuse_unequal_consent({"a@x.example": "all", "b@x.example": "all"}, both)
    with pytest.raises(LinkRefused, match="record the same opt-out for both first"):
        refuse_unequal_consent({"a@x.example": "all"}, both)
    with pytest.raises(LinkRefused, match="opted out"):
        refuse_unequal_consent({"a@x.example": "all", "b@x.example": "marketing"}, both)
