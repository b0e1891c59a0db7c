"""One-time HubSpot setup: the unique custom contact property our upserts are keyed by.

HubSpot's batch upsert takes an `idProperty` only if that property has unique values, and a
property's uniqueness cannot be changed after it is created. So before the first run against
a portal, create it once (`inboxcrm hubspot-setup`, needs a private-app token with the
`crm.schemas.contacts.write` scope in `INBOXCRM_CRM_TOKEN`):

    POST /crm/v3/properties/contacts
    {"name": "inboxcrm_contact_id", "type": "string", "fieldType": "text",
     "groupName": "contactinformation", "hasUniqueValue": true, ...}

Idempotent: a 409 (the property exists) is fine once the existing property is confirmed to
be a unique string property; an existing *non-unique* property of that name is an error
(upserts keyed by it would not be safe): pick another name (`--property`, and
`INBOXCRM_CRM_ID_PROPERTY` for the worker).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from inboxcrm.adapters.base import AdapterError
from inboxcrm.adapters.http import json_field, send_request

HUBSPOT_API = "https://api.hubapi.com"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,99}$")


class SetupError(Exception):
    """The property could not be created or confirmed; the message says why (no payload)."""


@dataclass(frozen=True)
class SetupResult:
    name: str
    status: Literal["created", "exists"]


NOTE_PROPERTY = "inboxcrm_note_id"
NOTE_GROUP = "inboxcrm"
# The unique property the conversation's email activities are created with (the adapter's
# EMAIL_ID_PROPERTY): a repeated create is refused as a conflict, never a second email.
EMAIL_PROPERTY = "inboxcrm_email_id"


def property_definition(name: str, group: str = "contactinformation") -> dict[str, Any]:
    return {
        "name": name,
        "label": ("inboxcrm contact ID" if group == "contactinformation"
                  else "inboxcrm email ID" if name == EMAIL_PROPERTY else "inboxcrm note ID"),
        "description": "Integration contact ID set by inboxcrm; unique, used to upsert "
                       "without duplicates. Do not edit.",
        "groupName": group,
        "type": "string",
        "fieldType": "text",
        "hasUniqueValue": True,
        "formField": False,
    }


def _reason(response: httpx.Response) -> str | None:
    category = json_field(response, "category")
    return f"http_{response.status_code}:{category}" if category else None


async def ensure_unique_property(client: httpx.AsyncClient, name: str,
                                 object_type: str = "contacts",
                                 group: str = "contactinformation") -> SetupResult:
    """Create the unique property, or confirm the existing one is unique. Safe to repeat."""
    properties_path = f"/crm/v3/properties/{object_type}"
    if not _NAME.match(name):
        raise SetupError(f"invalid HubSpot property name {name!r} (lowercase letters, digits, "
                         "underscores; starting with a letter)")
    try:
        response = await send_request(client, "POST", properties_path,
                                      json=property_definition(name, group), passthrough=(409,),
                                      reason=_reason)
        if response.status_code != 409:
            return SetupResult(name, "created")
        existing = await send_request(client, "GET", f"{properties_path}/{name}",
                                      reason=_reason)
    except AdapterError as exc:
        hint = ""
        if exc.classified.status_code in (401, 403):
            hint = (" (check INBOXCRM_CRM_TOKEN: a private-app token with the "
                    "crm.schemas.contacts.write scope)")
        raise SetupError(f"HubSpot refused: {exc}{hint}") from None
    try:
        prop = existing.json()
    except ValueError:
        prop = None
    if not isinstance(prop, dict):
        raise SetupError("HubSpot answered the property read without a property")
    if prop.get("hasUniqueValue") is not True:
        raise SetupError(
            f"contact property {name!r} exists but is not unique; HubSpot cannot make it "
            "unique afterwards: choose another name (--property and INBOXCRM_CRM_ID_PROPERTY)")
    if prop.get("type") != "string":
        raise SetupError(f"contact property {name!r} exists with type {prop.get('type')!r}, "
                         "not string")
    return SetupResult(name, "exists")


async def run_setup(base_url: str, token: str, name: str, *, timeout: float = 10.0,
                    transport: httpx.AsyncBaseTransport | None = None) -> SetupResult:
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, transport=transport,
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        return await ensure_unique_property(client, name)


async def run_note_setup(base_url: str, token: str, *, timeout: float = 10.0,
                         transport: httpx.AsyncBaseTransport | None = None,
                         object_type: str = "notes", name: str = NOTE_PROPERTY) -> SetupResult:
    """The unique note property the inbound-email notes are upserted by (or, with
    `object_type="emails"`, the email activities' `EMAIL_PROPERTY`), in a property group of
    our own (created if missing)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, transport=transport,
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        try:
            await send_request(client, "POST", f"/crm/v3/properties/{object_type}/groups",
                               json={"name": NOTE_GROUP, "label": "inboxcrm"},
                               passthrough=(409,), reason=_reason)
        except AdapterError as exc:
            raise SetupError(f"HubSpot refused the {object_type} property group: {exc}"
                             ) from None
        return await ensure_unique_property(client, name, object_type, NOTE_GROUP)
