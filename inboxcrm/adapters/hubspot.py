"""HubSpot-compatible CRM adapter (also the sandbox's contract).

Upserts go through batch upsert with `idProperty` = a unique custom property holding our
integration contact ID, so repeating the call can never create a second record.

The inbound email is logged as a note: a batch upsert by the unique `inboxcrm_note_id`
property with `hs_timestamp` (required by HubSpot: the message's date places the note on the
contact's timeline) and no `associations` (the batch-upsert input has none), then the v4
default association `PUT /crm/v4/objects/notes/{noteId}/associations/default/contacts/
{contactId}`, which is safe to repeat. Both run under the note's one operation key.

Adoption: HubSpot keeps email unique, so a contact a salesperson created (no ID of ours)
answers our upsert with 409 naming it. It is adopted, and our external ID property is
written onto it (`PATCH /crm/v3/objects/contacts/{id}`, with only the name and company
properties the policy allows that it holds empty: the owner, the email and every field a
person set are left alone), so later lookups by our ID find it without the 409. Later
writes to a record we did not create (adopted, or a merge's survivor) go through
`fill_contact`: one `GET` of `firstname,lastname,company`, then a `PATCH` of only what policy
allows and the record holds empty (the name counts as set when either part is); never
`email` (the record's primary email) or `hubspot_owner_id`. What no lookup rules out: a
person creating the contact in HubSpot's UI in the same second as our create; HubSpot's email
uniqueness then makes one of the two creates a 409, which is adopted the same way.

Merges (`survivor_of`, `claim_survivor`): a contact merged in HubSpot answers a read by its
old ID with the surviving record (another `id`, `hs_merged_object_ids`); the CRM step follows
it (docs/architecture.md §5, "Changes of address and merges") and writes our ID onto the
survivor when it carries none (`PATCH`, that property only).

A 429 names its limit in `policyName`: SECONDLY and TEN_SECONDLY_ROLLING are retried after
a short wait; DAILY parks the tenant's CRM scope until the reset (`inboxcrm.adapters.errors`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Collection
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

import httpx
from pydantic import field_validator, model_validator

from inboxcrm.adapters.base import (
    AdapterError,
    ContactFields,
    CrmRecord,
    CrmRecordView,
    EmailActivity,
    Filled,
    GuaranteeCheck,
    OptOut,
    OptOutWritten,
    Survivor,
    fields_to_fill,
)
from inboxcrm.adapters.errors import Category, Classified, classify_response
from inboxcrm.adapters.http import json_field, send_request
from inboxcrm.adapters.registry import (
    ConfigurationError,
    CrmProvider,
    Secrets,
    register,
    secret_value,
)
from inboxcrm.adapters.transport import AddressGuard, new_client
from inboxcrm.platform.conflicts import ConflictKind, count_conflict
from inboxcrm.schemas.destinations import CrmDestination, SecretRef, field_name

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings

HUBSPOT_API = "https://api.hubapi.com"

NOTE_ID_PROPERTY = "inboxcrm_note_id"
# The unique property of the email activities (engagements) we log (`hubspot-setup`).
EMAIL_ID_PROPERTY = "inboxcrm_email_id"
# HubSpot-defined association type: email → contact.
EMAIL_TO_CONTACT = 198
# "Unsubscribed from all email": read-only on the contact, set through the communication
# preferences API (v4 `unsubscribe-all` on the EMAIL channel).
OPT_OUT_PROPERTY = "hs_email_optout"
# The IDs of the contacts merged into a record (`;`-separated), set by HubSpot's merge.
MERGED_IDS_PROPERTY = "hs_merged_object_ids"
# What a fill-only write reads: the properties it may fill.
FILL_PROPERTIES = "firstname,lastname,company"
_EXISTING_ID = re.compile(r"Existing ID:\s*(\d+)")


def _reason(response: httpx.Response) -> str | None:
    if response.status_code == 429:
        # SECONDLY / TEN_SECONDLY_ROLLING / DAILY: the classifier knows each window's delay.
        policy = json_field(response, "policyName")
        if policy:
            return f"http_429:{policy}"
    if response.status_code == 207:
        category = _batch_error(response).get("category")
        return f"http_207:{category}" if isinstance(category, str) and category else None
    category = json_field(response, "category")
    return f"http_{response.status_code}:{category}" if category else None


def _batch_error(response: httpx.Response) -> dict[str, Any]:
    """The first per-input error of a 207 Multi-Status batch answer (or {})."""
    try:
        errors = response.json().get("errors")
    except (ValueError, AttributeError):
        return {}
    first = errors[0] if isinstance(errors, list) and errors else None
    return first if isinstance(first, dict) else {}


def _view(response: httpx.Response, id_property: str) -> CrmRecordView:
    """A contact answer's own ID and our external-ID property on it."""
    try:
        body = response.json()
        properties = body.get("properties") or {}
        found = str(body["id"])
    except (ValueError, AttributeError, KeyError, TypeError):
        raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                      response.status_code)) from None
    owner = properties.get(id_property) if isinstance(properties, dict) else None
    return CrmRecordView(record_id=found, external_id=str(owner) if owner else None)


def _split_name(name: str | None) -> tuple[str | None, str | None]:
    if not name:
        return None, None
    first, _, last = name.strip().partition(" ")
    return first or None, last or None


def _properties(response: httpx.Response) -> dict[str, Any]:
    try:
        properties = response.json().get("properties")
    except (ValueError, AttributeError):
        return {}
    return properties if isinstance(properties, dict) else {}


def _fill_update(properties: dict[str, Any], fields: ContactFields,
                 allowed: Collection[str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The properties a fill-only write sends onto a contact we did not create (the name
    counts as set when either part is), and our field names they are."""
    empty = set()
    if not properties.get("firstname") and not properties.get("lastname"):
        empty.add("name")
    if not properties.get("company"):
        empty.add("company")
    fill = fields_to_fill(fields, allowed, empty)
    update: dict[str, str] = {}
    if "name" in fill:
        first, last = _split_name(fill["name"])
        update.update({k: v for k, v in (("firstname", first), ("lastname", last)) if v})
    if "company" in fill:
        update["company"] = fill["company"]
    return update, tuple(fill)


class HubSpotCrm:
    name = "hubspot"

    def __init__(self, base_url: str, token: str | None, id_property: str, timeout: float,
                 guard: AddressGuard | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = new_client(base_url, headers, timeout, guard)
        self._id_property = id_property

    @property
    def endpoint(self) -> str:
        """The base URL this client calls (no credentials): what a worker reports of its
        destinations (`Destinations.endpoints`)."""
        return str(self._client.base_url)

    async def upsert_contact(self, external_id: str, fields: ContactFields) -> CrmRecord:
        first, last = _split_name(fields.name)
        properties = {"email": fields.email, self._id_property: external_id}
        for key, value in (("firstname", first), ("lastname", last), ("company", fields.company)):
            if value:
                properties[key] = value
        body = {"inputs": [{"idProperty": self._id_property, "id": external_id,
                            "properties": properties}]}
        response = await send_request(
            self._client, "POST", "/crm/v3/objects/contacts/batch/upsert",
            json=body, passthrough=(409,), reason=_reason,
        )
        if response.status_code == 409:
            # An existing contact already owns this email: adopt it, never create another.
            count_conflict(ConflictKind.CRM_CONTACT_EMAIL)
            match = _EXISTING_ID.search(json_field(response, "message") or "")
            if match is None:
                raise AdapterError(Classified(Category.PERMANENT, "http_409:CONFLICT", None, 409))
            return await self._adopt(match.group(1), external_id, fields)
        error = _batch_error(response) if response.status_code == 207 else {}
        if error:
            # Multi-status: our one input failed. A conflict names the owner (adopt it);
            # anything else is classified by its category like any error answer.
            match = _EXISTING_ID.search(str(error.get("message") or ""))
            if error.get("category") == "CONFLICT" and match is not None:
                count_conflict(ConflictKind.CRM_CONTACT_EMAIL)
                return await self._adopt(match.group(1), external_id, fields)
            raise AdapterError(classify_response(response, _reason(response)))
        results = response.json().get("results") or []
        if len(results) != 1 or "id" not in results[0]:
            # The CRM answered success without the record: we cannot tell what it did.
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None, 200))
        return CrmRecord(record_id=str(results[0]["id"]), created=results[0].get("new"))

    async def _adopt(self, record_id: str, external_id: str,
                     fields: ContactFields) -> CrmRecord:
        """Write our external ID onto the existing contact, with only the properties the
        policy lets an adoption fill (`fields.fill`) that it holds empty; never the email,
        the owner or what a person set. A contact that already carries another ID of ours
        (two tenants sharing one HubSpot account, where each holds its own contact for one
        address) is adopted as it is: its ID is the other's, and overwriting it would take
        the record away from them."""
        path = f"/crm/v3/objects/contacts/{quote(record_id, safe='')}"
        current = await send_request(
            self._client, "GET", path,
            params={"properties": f"{self._id_property},{FILL_PROPERTIES}"}, reason=_reason)
        properties = _properties(current)
        held = properties.get(self._id_property)
        if held:
            return CrmRecord(record_id=record_id, created=False, adopted=True,
                             marked=held == external_id)
        update, _ = _fill_update(properties, fields, fields.fill)
        await send_request(self._client, "PATCH", path,
                           json={"properties": {self._id_property: external_id, **update}},
                           reason=_reason)
        return CrmRecord(record_id=record_id, created=False, adopted=True, marked=True)

    async def find_contact(self, external_id: str) -> CrmRecord | None:
        response = await send_request(
            self._client, "GET", f"/crm/v3/objects/contacts/{external_id}",
            params={"idProperty": self._id_property}, passthrough=(404,), reason=_reason,
        )
        if response.status_code == 404:
            return None
        return CrmRecord(record_id=str(response.json()["id"]))

    async def fill_contact(self, record_id: str, fields: ContactFields,
                           allowed: Collection[str]) -> Filled | None:
        path = f"/crm/v3/objects/contacts/{quote(record_id, safe='')}"
        response = await send_request(self._client, "GET", path,
                                      params={"properties": FILL_PROPERTIES},
                                      passthrough=(404,), reason=_reason)
        if response.status_code == 404:
            return None
        # A contact merged since the step's merge read answers as its survivor: filled so.
        found = _view(response, self._id_property).record_id
        update, filled = _fill_update(_properties(response), fields, allowed)
        if update:
            await send_request(self._client, "PATCH",
                               f"/crm/v3/objects/contacts/{quote(found, safe='')}",
                               json={"properties": update}, reason=_reason)
        return Filled(record_id=found, fields=filled)

    async def log_note(self, note_key: str, record_id: str, text: str,
                       occurred_at: datetime) -> str:
        """Upsert the note by the unique `inboxcrm_note_id` property (created by `inboxcrm
        hubspot-setup`), then associate it with the contact: a retry repeats both and
        changes nothing. HubSpot renders `hs_note_body` as HTML, and the text carries what a
        sender chose (a delivery's `Message-Id`): it is escaped, so it shows as written."""
        stamp = occurred_at.astimezone(UTC).isoformat(timespec="milliseconds")
        body = {"inputs": [{
            "idProperty": NOTE_ID_PROPERTY, "id": note_key,
            "properties": {"hs_note_body": html.escape(text),
                           "hs_timestamp": stamp.replace("+00:00", "Z"),
                           NOTE_ID_PROPERTY: note_key},
        }]}
        response = await send_request(self._client, "POST", "/crm/v3/objects/notes/batch/upsert",
                                      json=body, reason=_reason)
        results = response.json().get("results") or []
        if len(results) != 1 or "id" not in results[0]:
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None, 200))
        note_id = str(results[0]["id"])
        await self.associate_note(note_id, record_id)
        return note_id

    async def associate_note(self, note_id: str, record_id: str) -> None:
        """The v4 default (unlabelled) note → contact association; idempotent."""
        await send_request(
            self._client, "PUT",
            f"/crm/v4/objects/notes/{quote(note_id, safe='')}/associations/default/contacts/"
            f"{quote(record_id, safe='')}", reason=_reason)

    async def find_note(self, note_key: str) -> str | None:
        response = await send_request(
            self._client, "GET", f"/crm/v3/objects/notes/{note_key}",
            params={"idProperty": NOTE_ID_PROPERTY}, passthrough=(404,), reason=_reason,
        )
        return None if response.status_code == 404 else str(response.json()["id"])

    async def log_email(self, email_key: str, record_id: str, email: EmailActivity) -> str:
        """`POST /crm/v3/objects/emails` with its contact association, keyed by the unique
        `inboxcrm_email_id`: a repeat (after an answer that was lost) is refused as a
        conflict and answered with the email already logged. HubSpot reads
        `hs_email_text` as plain text."""
        stamp = email.occurred_at.astimezone(UTC).isoformat(timespec="milliseconds")
        body = {
            "properties": {
                "hs_timestamp": stamp.replace("+00:00", "Z"),
                "hs_email_direction": "INCOMING_EMAIL" if email.inbound else "EMAIL",
                "hs_email_status": "SENT",
                "hs_email_subject": email.subject,
                "hs_email_text": email.text,
                EMAIL_ID_PROPERTY: email_key,
            },
            "associations": [{
                "to": {"id": record_id},
                "types": [{"associationCategory": "HUBSPOT_DEFINED",
                           "associationTypeId": EMAIL_TO_CONTACT}],
            }],
        }
        response = await send_request(self._client, "POST", "/crm/v3/objects/emails",
                                      json=body, passthrough=(409,), reason=_reason)
        if response.status_code == 409:
            count_conflict(ConflictKind.CRM_EMAIL_ACTIVITY)
            found = await self.find_email(email_key)
            if found is None:
                raise AdapterError(Classified(Category.UNKNOWN, "email_conflict", None, 409))
            return found
        found = json_field(response, "id")
        if found is None:
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                          response.status_code))
        return found

    async def find_email(self, email_key: str) -> str | None:
        response = await send_request(
            self._client, "GET", f"/crm/v3/objects/emails/{quote(email_key, safe='')}",
            params={"idProperty": EMAIL_ID_PROPERTY}, passthrough=(404,), reason=_reason,
        )
        return None if response.status_code == 404 else str(response.json()["id"])

    async def read_contact(self, record_id: str) -> CrmRecordView | None:
        """GET by HubSpot's record ID with our property requested (custom properties are
        returned only when asked for)."""
        response = await send_request(
            self._client, "GET", f"/crm/v3/objects/contacts/{quote(record_id, safe='')}",
            params={"properties": self._id_property}, passthrough=(404,), reason=_reason,
        )
        if response.status_code == 404:
            return None
        return _view(response, self._id_property)

    follows_notes = False  # the old ID's read names the survivor

    async def survivor_of(self, record_id: str, external_id: str | None = None,
                          notes: tuple[str, ...] = ()) -> Survivor | None:
        """GET by the stored ID: a merged contact's old ID answers the surviving record (its
        `id` differs; `hs_merged_object_ids` lists the IDs merged into it)."""
        response = await send_request(
            self._client, "GET", f"/crm/v3/objects/contacts/{quote(record_id, safe='')}",
            params={"properties": f"{self._id_property},{MERGED_IDS_PROPERTY}"},
            passthrough=(404,), reason=_reason)
        if response.status_code == 404:
            return None
        view = _view(response, self._id_property)
        if view.record_id == record_id:
            return None
        return Survivor(record_id=view.record_id, external_id=view.external_id)

    async def claim_survivor(self, survivor: Survivor, external_id: str) -> bool:
        if survivor.external_id:
            return survivor.external_id == external_id
        await send_request(
            self._client, "PATCH",
            f"/crm/v3/objects/contacts/{quote(survivor.record_id, safe='')}",
            json={"properties": {self._id_property: external_id}}, reason=_reason)
        return True

    consent_field = OPT_OUT_PROPERTY

    async def read_opt_out(self, record_id: str) -> OptOut:
        """`hs_email_optout` of the contact, read by ID (custom and non-default properties
        come only when asked for). Subscription types (per-topic statuses of the
        communication preferences API) are not read: docs/consent.md."""
        response = await send_request(
            self._client, "GET", f"/crm/v3/objects/contacts/{quote(record_id, safe='')}",
            params={"properties": OPT_OUT_PROPERTY}, reason=_reason)
        try:
            properties = response.json().get("properties") or {}
        except (ValueError, AttributeError):
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                          response.status_code)) from None
        value = properties.get(OPT_OUT_PROPERTY) if isinstance(properties, dict) else None
        return OptOut(record_id=record_id, field=OPT_OUT_PROPERTY,
                      opted_out=str(value).lower() == "true")

    async def write_opt_out(self, email: str, record_id: str | None) -> OptOutWritten:
        """`POST /communication-preferences/v4/statuses/{email}/unsubscribe-all?channel=EMAIL`:
        the address is opted out of all email, which HubSpot shows as `hs_email_optout` on
        its contact (the property itself is read-only). Repeating it changes nothing."""
        await send_request(
            self._client, "POST",
            f"/communication-preferences/v4/statuses/{quote(email, safe='@')}/unsubscribe-all",
            params={"channel": "EMAIL"}, reason=_reason)
        return OptOutWritten(field=OPT_OUT_PROPERTY,
                             record_ids=(record_id,) if record_id else ())

    async def check_external_id(self) -> tuple[GuaranteeCheck, ...]:
        """`GET /crm/v3/properties/{contacts|notes}/{name}`: our contact and note properties
        exist, are unique (`hasUniqueValue`, which HubSpot cannot change after creation) and
        hold strings."""
        checks = []
        for object_type, name in (("contacts", self._id_property), ("notes", NOTE_ID_PROPERTY)):
            response = await send_request(
                self._client, "GET", f"/crm/v3/properties/{object_type}/{quote(name, safe='')}",
                passthrough=(404,), reason=_reason)
            prop = json_body(response) if response.status_code == 200 else None
            if response.status_code == 200 and not isinstance(prop, dict):
                raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None, 200))
            checks.append(GuaranteeCheck(self.name, object_type, name,
                                         _property_problem(object_type, name, prop)))
        return tuple(checks)

    async def aclose(self) -> None:
        await self._client.aclose()


def json_body(response: httpx.Response) -> Any:
    """The answer's JSON, None when it is not JSON (the check then reports a mismatch, an
    `AdapterError`, rather than crash a worker's start)."""
    try:
        return response.json()
    except ValueError:
        return None


def _property_problem(object_type: str, name: str, prop: Any) -> str | None:
    what = "contact" if object_type == "contacts" else "note"
    setting = ("destinations.crm.id_property / INBOXCRM_CRM_ID_PROPERTY" if what == "contact"
               else "none: the note property's name is fixed")
    if not isinstance(prop, dict):
        return (f"HubSpot {what} property {name} does not exist: run `inboxcrm hubspot-setup` "
                "to create it unique")
    if prop.get("hasUniqueValue") is not True:
        return (f"HubSpot {what} property {name} is not unique (hasUniqueValue false) and "
                "HubSpot cannot make it unique afterwards: create a unique one "
                f"(`inboxcrm hubspot-setup --property NAME`) and name it ({setting})")
    if prop.get("type") != "string":
        return (f"HubSpot {what} property {name} has type {prop.get('type')!r}, not string: "
                "create a unique string property (`inboxcrm hubspot-setup --property NAME`)")
    return None


# --- the providers: HubSpot, and the sandbox that speaks HubSpot's API ------------------------
class HubSpotDestination(CrmDestination):
    """A tenant's HubSpot portal (`destinations.crm` with `"provider": "hubspot"`)."""

    token_required: ClassVar[bool] = True
    # HubSpot's API host (developers.hubspot.com/docs/api/overview).
    documented_hosts: ClassVar[tuple[str, ...]] = ("api.hubapi.com",)
    url: str | None = None             # API base URL (default: the public API)
    token: SecretRef | None = None     # the private app token
    id_property: str | None = None     # our unique contact property (default: the global one)

    def endpoints(self) -> list[tuple[str, str]]:
        return [("url", self.url)] if self.url else []

    @field_validator("id_property")
    @classmethod
    def _field_name(cls, value: str | None) -> str | None:
        return field_name(value)

    @model_validator(mode="after")
    def _complete(self) -> HubSpotDestination:
        if self.token_required and self.token is None:
            raise ValueError(f"a {self.provider} destination needs its token")
        return self


class SandboxCrmDestination(HubSpotDestination):
    """An account on the HubSpot-compatible sandbox (default: the global sandbox URL); the
    token is its API key, where it has one."""

    token_required: ClassVar[bool] = False
    # None: a sandbox URL in a policy must be one the operator allows (unset: theirs).
    documented_hosts: ClassVar[tuple[str, ...]] = ()


@register
class HubSpotProvider(CrmProvider[HubSpotDestination]):
    name = HubSpotCrm.name
    destination = HubSpotDestination
    sandbox = ("inboxcrm/sandbox/crm.py", "inboxcrm/sandbox/notes.py")
    conformance = "tests/conformance/test_hubspot.py"
    default_url: ClassVar[str | None] = HUBSPOT_API

    def _url(self, settings: Settings) -> str:
        return self.default_url or settings.sandbox_url

    def from_settings(self, settings: Settings) -> HubSpotCrm:
        token = secret_value(settings.crm_token)
        if self.destination.token_required and not token:
            raise ConfigurationError(f"INBOXCRM_CRM_TOKEN is required for the {self.name} "
                                     "provider")
        return HubSpotCrm(settings.crm_url or self._url(settings), token,
                          settings.crm_id_property, settings.http_timeout_seconds)

    def from_destination(self, spec: HubSpotDestination, settings: Settings,
                         secrets: Secrets) -> HubSpotCrm:
        return HubSpotCrm(spec.url or self._url(settings), secrets.optional(spec.token, "token"),
                          spec.id_property or settings.crm_id_property,
                          settings.http_timeout_seconds, secrets.guard)


@register
class SandboxCrmProvider(HubSpotProvider):
    """`sandbox`: the HubSpot adapter against the sandbox (INBOXCRM_SANDBOX_URL, or
    INBOXCRM_CRM_URL when set); the local stack's and the tests' CRM."""

    name = "sandbox"
    destination = SandboxCrmDestination
    default_url = None
