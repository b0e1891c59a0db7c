"""HubSpot through hubspot-api-client (client-side validation on): every call and error the
HubSpot adapter relies on, parsed by the SDK's own models."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from hubspot.crm.associations.v4.models import BatchResponsePublicDefaultAssociation
from hubspot.crm.contacts import ApiException as ContactsApiException
from hubspot.crm.contacts.models import (
    BatchInputSimplePublicObjectBatchInputUpsert as ContactBatch,
)
from hubspot.crm.contacts.models import (
    BatchResponseSimplePublicUpsertObject as ContactUpsertAnswer,
)
from hubspot.crm.contacts.models import (
    Filter,
    FilterGroup,
    PublicObjectSearchRequest,
)
from hubspot.crm.contacts.models import (
    SimplePublicObjectBatchInputUpsert as ContactInput,
)
from hubspot.crm.objects.notes import ApiException as NotesApiException
from hubspot.crm.objects.notes.models import (
    BatchInputSimplePublicObjectBatchInputUpsert as NoteBatch,
)
from hubspot.crm.objects.notes.models import (
    BatchResponseSimplePublicUpsertObject as NoteUpsertAnswer,
)
from hubspot.crm.objects.notes.models import (
    SimplePublicObjectBatchInputUpsert as NoteInput,
)

from tests.helpers.conformance import hubspot_client, hubspot_error
from tests.helpers.sandbox_process import API_KEY, SandboxProcess

ID_PROP = "inboxcrm_contact_id"
NOTE_PROP = "inboxcrm_note_id"
STAMP = "2026-11-29T10:00:00.000Z"


@pytest.fixture
def client(sandbox: SandboxProcess) -> Any:
    return hubspot_client(sandbox.url, API_KEY)


def upsert_contact(client: Any, external_id: str, email: str) -> ContactUpsertAnswer:
    batch = ContactBatch(inputs=[ContactInput(
        id_property=ID_PROP, id=external_id,
        properties={"email": email, ID_PROP: external_id, "firstname": "Ada"})])
    return client.crm.contacts.batch_api.upsert(batch)


def upsert_note(client: Any, key: str, **extra: str) -> NoteUpsertAnswer:
    properties = {"hs_note_body": "Inbound email.", NOTE_PROP: key, **extra}
    batch = NoteBatch(inputs=[NoteInput(id_property=NOTE_PROP, id=key, properties=properties)])
    return client.crm.objects.notes.batch_api.upsert(batch)


async def fault(sandbox: SandboxProcess, **body: Any) -> None:
    async with httpx.AsyncClient(base_url=sandbox.url) as control:
        (await control.post("/_sandbox/faults", json=body)).raise_for_status()


async def state(sandbox: SandboxProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=sandbox.url) as control:
        return dict((await control.get("/_sandbox/state")).json())


async def test_contact_upsert_by_unique_property_then_read_and_search(client: Any) -> None:
    external = str(uuid.uuid4())
    first = upsert_contact(client, external, "ada@example.com")
    again = upsert_contact(client, external, "ada@example.com")
    assert first.status == "COMPLETE" and first.started_at and first.completed_at
    assert (first.results[0].new, again.results[0].new) == (True, False)
    record_id = first.results[0].id
    assert again.results[0].id == record_id
    read = client.crm.contacts.basic_api.get_by_id(contact_id=external, id_property=ID_PROP)
    assert read.id == record_id and read.properties[ID_PROP] == external
    search = PublicObjectSearchRequest(filter_groups=[FilterGroup(filters=[
        Filter(property_name=ID_PROP, operator="EQ", value=external)])], limit=10)
    found = client.crm.contacts.search_api.do_search(search)
    assert found.total in (0, 1)  # the search index lags; the answer still fits the model


async def test_a_seeded_contact_is_marked_by_update_and_read_by_our_id(
        client: Any, sandbox: SandboxProcess) -> None:
    """Adoption as the adapter does it: the 409 names the salesperson's contact, the basic
    update writes our unique property onto it, a read by our ID finds it."""
    from hubspot.crm.contacts.models import SimplePublicObjectInput

    async with httpx.AsyncClient(base_url=sandbox.url) as control:
        seeded = (await control.post("/_sandbox/seed", json={"crm": "hubspot", "contacts": [
            {"email": "sam@example.com", "owner": "7001"}]})).json()["contacts"][0]["id"]
    external = str(uuid.uuid4())
    with pytest.raises(ContactsApiException) as conflict:
        upsert_contact(client, external, "sam@example.com")
    assert conflict.value.status == 409 and seeded in json.loads(conflict.value.body)["message"]
    updated = client.crm.contacts.basic_api.update(
        contact_id=seeded, simple_public_object_input=SimplePublicObjectInput(
            properties={ID_PROP: external}))
    assert updated.id == seeded and updated.properties["hubspot_owner_id"] == "7001"
    read = client.crm.contacts.basic_api.get_by_id(contact_id=external, id_property=ID_PROP)
    assert read.id == seeded


async def test_contact_errors_fit_the_error_model(client: Any) -> None:
    with pytest.raises(ContactsApiException) as missing:
        client.crm.contacts.basic_api.get_by_id(contact_id="nobody", id_property=ID_PROP)
    assert missing.value.status == 404
    assert hubspot_error(missing.value).category == "OBJECT_NOT_FOUND"
    owner = upsert_contact(client, str(uuid.uuid4()), "grace@example.com").results[0].id
    with pytest.raises(ContactsApiException) as conflict:
        upsert_contact(client, str(uuid.uuid4()), "grace@example.com")
    assert conflict.value.status == 409
    assert f"Existing ID: {owner}" in hubspot_error(conflict.value).message


async def test_note_needs_hs_timestamp_and_answers_started_at(client: Any) -> None:
    with pytest.raises(NotesApiException) as refused:
        upsert_note(client, str(uuid.uuid4()))
    assert refused.value.status == 400
    assert hubspot_error(refused.value).category == "VALIDATION_ERROR"
    answer = upsert_note(client, str(uuid.uuid4()), hs_timestamp=STAMP)
    assert answer.started_at and answer.completed_at and answer.results[0].new is True
    assert answer.results[0].properties["hs_timestamp"] == STAMP


async def test_batch_upsert_input_has_no_associations_field(sandbox: SandboxProcess) -> None:
    """The SDK's upsert input cannot even say `associations`; sent raw, HubSpot refuses it."""
    assert "associations" not in NoteInput.attribute_map.values()
    key = str(uuid.uuid4())
    body = {"inputs": [{"idProperty": NOTE_PROP, "id": key,
                        "properties": {"hs_note_body": "x", "hs_timestamp": STAMP},
                        "associations": [{"to": {"id": "101"}, "types": []}]}]}
    async with httpx.AsyncClient(base_url=sandbox.url,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as raw:
        answer = await raw.post("/crm/v3/objects/notes/batch/upsert", json=body)
    assert answer.status_code == 400
    assert hubspot_error(type("E", (), {"body": answer.content})()).category == "VALIDATION_ERROR"
    assert (await state(sandbox))["notes"] == []


async def test_v4_default_association_is_idempotent_and_reads_back(
        client: Any, sandbox: SandboxProcess) -> None:
    contact = upsert_contact(client, str(uuid.uuid4()), "lin@example.com").results[0].id
    key = str(uuid.uuid4())
    note = upsert_note(client, key, hs_timestamp=STAMP).results[0].id
    for _ in range(2):
        answer = client.crm.associations.v4.basic_api.create_default(
            from_object_type="notes", from_object_id=note, to_object_type="contacts",
            to_object_id=contact)
        assert isinstance(answer, BatchResponsePublicDefaultAssociation)
        assert {(r._from.id, r.to.id) for r in answer.results} >= {(note, contact)}
    read = client.crm.objects.notes.basic_api.get_by_id(
        note_id=key, id_property=NOTE_PROP, associations=["contacts"],
        properties=["hs_timestamp"])
    assert read.id == note and read.properties["hs_timestamp"] == STAMP
    [associated] = read.associations["contacts"].results
    assert (associated.id, associated.type) == (contact, "note_to_contact")
    [stored] = (await state(sandbox))["notes"]
    assert stored["associations"]["contacts"] == [contact]
    with pytest.raises(Exception) as missing:
        client.crm.associations.v4.basic_api.create_default(
            from_object_type="notes", from_object_id=note, to_object_type="contacts",
            to_object_id="999999999")
    assert getattr(missing.value, "status", None) == 404


@pytest.mark.parametrize("policy", ["SECONDLY", "TEN_SECONDLY_ROLLING", "DAILY"])
async def test_rate_limit_names_its_policy(client: Any, sandbox: SandboxProcess,
                                           policy: str) -> None:
    await fault(sandbox, target="crm.upsert", mode="rate_limit", policy=policy, retry_after=2)
    with pytest.raises(ContactsApiException) as limited:
        upsert_contact(client, str(uuid.uuid4()), "max@example.com")
    assert limited.value.status == 429
    assert hubspot_error(limited.value).category == "RATE_LIMITS"
    body = json.loads(limited.value.body)
    assert (body["policyName"], body["errorType"]) == (policy, "RATE_LIMIT")
    retry_after = limited.value.headers.get("Retry-After")
    assert retry_after == (None if policy == "DAILY" else "2")


async def test_wrong_token_is_401(sandbox: SandboxProcess) -> None:
    with pytest.raises(ContactsApiException) as refused:
        upsert_contact(hubspot_client(sandbox.url, "wrong"), str(uuid.uuid4()), "x@example.com")
    assert refused.value.status == 401
    assert hubspot_error(refused.value).category == "INVALID_AUTHENTICATION"


async def test_property_definitions_answer_has_unique_value(client: Any,
                                                            sandbox: SandboxProcess) -> None:
    """`crm check` reads `hasUniqueValue` from the property definition: parsed by the SDK's
    `ModelProperty` model; a property the account has as non-unique (the sandbox's `crm_fields`)
    answers false, a missing one the SDK's 404."""
    from hubspot.crm.properties import ApiException as PropertiesApiException
    from hubspot.crm.properties.models import ModelProperty

    ours = client.crm.properties.core_api.get_by_name("contacts", ID_PROP)
    assert isinstance(ours, ModelProperty)
    assert (ours.name, ours.type, ours.has_unique_value) == (ID_PROP, "string", True)
    assert client.crm.properties.core_api.get_by_name("notes", NOTE_PROP).has_unique_value
    assert not client.crm.properties.core_api.get_by_name("contacts", "email").has_unique_value
    async with httpx.AsyncClient(base_url=sandbox.url) as control:
        (await control.post("/_sandbox/config", json={"crm_fields": {
            ID_PROP: "not_unique", "legacy_ref": "missing"}})).raise_for_status()
        try:
            flipped = client.crm.properties.core_api.get_by_name("contacts", ID_PROP)
            assert flipped.has_unique_value is False
            with pytest.raises(PropertiesApiException) as missing:
                client.crm.properties.core_api.get_by_name("contacts", "legacy_ref")
            assert missing.value.status == 404
            assert hubspot_error(missing.value).category == "OBJECT_NOT_FOUND"
        finally:
            await control.post("/_sandbox/config", json={"crm_fields": {}})


# --- email engagements (the conversation in the CRM) -------------------------------------
EMAIL_PROP = "inboxcrm_email_id"


def create_email(client: Any, key: str, contact: str) -> Any:
    from hubspot.crm.objects.emails.models import (
        AssociationSpec,
        PublicAssociationsForObject,
        PublicObjectId,
        SimplePublicObjectInputForCreate,
    )
    return client.crm.objects.emails.basic_api.create(SimplePublicObjectInputForCreate(
        properties={"hs_timestamp": STAMP, "hs_email_direction": "INCOMING_EMAIL",
                    "hs_email_status": "SENT", "hs_email_subject": "Pricing",
                    "hs_email_text": "Hi, could you send me pricing?", EMAIL_PROP: key},
        associations=[PublicAssociationsForObject(
            to=PublicObjectId(id=contact),
            types=[AssociationSpec(association_category="HUBSPOT_DEFINED",
                                   association_type_id=198)])]))


async def test_an_email_engagement_is_created_with_its_contact_and_never_twice(
        client: Any, sandbox: SandboxProcess) -> None:
    """`POST /crm/v3/objects/emails` with inline associations (the adapter's
    `log_email`), read back by the unique property; the same value again is a 409
    CONFLICT, so a repeated create after a lost answer logs nothing twice."""
    from hubspot.crm.objects.emails import ApiException as EmailsApiException
    from hubspot.crm.objects.emails.models import SimplePublicObject

    contact = upsert_contact(client, str(uuid.uuid4()), "eve@example.com").results[0].id
    key = str(uuid.uuid4())
    created = create_email(client, key, contact)
    assert isinstance(created, SimplePublicObject)
    read = client.crm.objects.emails.basic_api.get_by_id(
        email_id=key, id_property=EMAIL_PROP, properties=["hs_email_subject"])
    assert read.id == created.id and read.properties["hs_email_subject"] == "Pricing"
    with pytest.raises(EmailsApiException) as again:
        create_email(client, key, contact)
    assert again.value.status == 409
    assert hubspot_error(again.value).category == "CONFLICT"
    [activity] = (await state(sandbox))["activities"]
    assert (activity["type"], activity["direction"], activity["records"]) == (
        "email", "INCOMING_EMAIL", [contact])
    with pytest.raises(EmailsApiException) as missing:
        client.crm.objects.emails.basic_api.get_by_id(email_id="nothing",
                                                      id_property=EMAIL_PROP)
    assert missing.value.status == 404


async def test_a_merged_contacts_old_id_answers_the_survivor(
        client: Any, sandbox: SandboxProcess) -> None:
    """A merge as a salesperson makes it (`basic_api.merge`, the SDK's `PublicMergeInput`):
    the old ID reads as the survivor (another `id`, `hs_merged_object_ids` naming the old
    one), and our ID on the merged record no longer finds anything."""
    from hubspot.crm.contacts.models import PublicMergeInput

    ours_external = str(uuid.uuid4())
    ours = upsert_contact(client, ours_external, f"old.{ours_external[:8]}@example.com")
    old_id = ours.results[0].id
    async with httpx.AsyncClient(base_url=sandbox.url) as control:
        kept = (await control.post("/_sandbox/seed", json={"crm": "hubspot", "contacts": [
            {"email": f"kept.{ours_external[:8]}@example.com", "owner": "7001"}]})
                ).json()["contacts"][0]["id"]
    merged = client.crm.contacts.basic_api.merge(public_merge_input=PublicMergeInput(
        primary_object_id=kept, object_id_to_merge=old_id))
    assert merged.id == kept and merged.properties["hubspot_owner_id"] == "7001"
    read = client.crm.contacts.basic_api.get_by_id(
        contact_id=old_id, properties=[ID_PROP, "hs_merged_object_ids"])
    assert read.id == kept and old_id in read.properties["hs_merged_object_ids"].split(";")
    assert not read.properties.get(ID_PROP)  # the merged record's unique value is not kept
    with pytest.raises(ContactsApiException) as gone:
        client.crm.contacts.basic_api.get_by_id(contact_id=ours_external, id_property=ID_PROP)
    assert gone.value.status == 404
    with pytest.raises(ContactsApiException) as itself:
        client.crm.contacts.basic_api.merge(public_merge_input=PublicMergeInput(
            primary_object_id=kept, object_id_to_merge=kept))
    assert itself.value.status == 400
