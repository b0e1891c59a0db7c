"""Salesforce CRM adapter: upsert by External ID (REST API, sObject Contact).

`PATCH /services/data/vXX.X/sobjects/Contact/{ExternalIdField}/{contact_id}` creates the
Contact if no record has that external ID and updates it if exactly one has, so repeating
the call can never create a second record. The external ID field is a custom text field
marked *External ID* and *Unique* (default `Inboxcrm_Contact_Id__c`); with a unique field
the lookup is an index read, and Salesforce rejects a second record with the same value.

Fields sent: `Email`, `FirstName`, `LastName` (required by Salesforce on create: when the
name has no last part the placeholder `[unknown]` is sent), and the company name as a text
field of its own (default custom field `Inboxcrm_Company__c`; set the company field to ""
to send none). A Contact's `Account` is a lookup, and creating or matching Accounts would be
a second side effect with its own key, so it is left to the CRM's own automation.

The inbound email is logged as a completed Task on the Contact (`WhoId`), upserted the same
way by its own external ID field on Activity (default `Inboxcrm_Note_Id__c`, External ID +
Unique), so a retry of the note never logs it twice and never repeats the contact upsert.

Answers (all classification in `inboxcrm.adapters.errors`):
- 201 created, 200 updated (API v46.0+), 204 updated (older versions; no body: the Id is
  read back by external ID, read-after-write consistent);
- 300 the external ID matches several records (a non-unique external ID field): permanent
  `http_300:MULTIPLE_MATCHES`, the item is blocked for review; we never pick one;
- 400/404 error arrays `[{"errorCode": ..., "message": ...}]`: permanent, reason from the
  errorCode (`UNABLE_TO_LOCK_ROW` excepted: transient);
- 401 `INVALID_SESSION_ID`: the session expired or was revoked. With OAuth (`ClientCredentials`)
  the adapter fetches a new access token once and repeats the call (safe: an upsert by
  External ID is idempotent, and a 401 did nothing); a second 401, or a fixed token, is
  permanent: blocked until the credential is replaced;
- 403 `REQUEST_LIMIT_EXCEEDED`: the org's API limit, transient with a long delay.

Match before create. A Contact a salesperson created has no external ID of ours, so the
upsert alone would create a second one (an org without a duplicate rule) or be refused with
`DUPLICATES_DETECTED` (the standard rule). When no record has our ID, the Contacts with the
canonical email are read with SOQL (`GET …/query?q=SELECT … FROM Contact WHERE Email = '…'`,
a record read, not a search index): none → the upsert creates ours; one → adopted: our
External ID is written onto it by `PATCH …/sobjects/Contact/{Id}`, with only the name and
company fields the policy allows that are empty on it (the name counts as set when any part
is), never `Email`, `OwnerId` or a field a person set;
several → `MatchCandidates` (a person picks). Records that carry another of our IDs are not
candidates. Our own writers are serialised by the contact row lock; what this read cannot
rule out is a person creating the same Contact in Salesforce's UI between the read and the
write (docs/architecture.md §5, "Activities"). Later writes to a record we did not create
(adopted, or a merge's master) are `fill_contact`: the record read by Id (`FirstName`,
`LastName`, the company field; a Lead's `Company`), then a `PATCH` by Id of only what policy
allows and the record holds empty (the placeholders count as empty); never `Email`,
`OwnerId` or our External ID.

Leads. Where inbound sales mail usually lands. The tenant's `new_prospects` (`contact`, the
default, or `lead`) decides what a person no record holds becomes: a Lead is upserted by the
same External ID field on Lead (`PATCH …/sobjects/Lead/{field}/{id}`, with the standard
`Company` a Lead requires, `[unknown]` when we have none). Matching reads both objects
whatever the policy: our ID on a Contact, else on a Lead; else the Contacts and Leads with the
email (two SOQL reads), a converted Lead (`IsConverted`) standing for its Contact
(`ConvertedContactId`); one free record is adopted (on a Lead as on a Contact), several are
candidates. Our own Lead, once a salesperson converts it, is followed to its Contact, which
gets our ID. A record's object is told by its Id's key prefix (`00Q` Lead, else Contact), so
the drift check, the opt-out read and the note (`WhoId`) reach a Lead too.

Merges (`survivor_of`, `claim_survivor`): a merged Contact or Lead is deleted, its
`MasterRecordId` the survivor, read by `queryAll` (deleted records included); a stored Lead a
salesperson converted is followed the same way to its Contact (`ConvertedContactId`, in the
same read). The CRM step follows it (docs/architecture.md §5, "Changes of address and
merges") and writes our External ID onto the survivor when it carries none (`PATCH
…/sobjects/{Contact|Lead}/{Id}`, that field only).

Guarantee check (`check_external_id`, `inboxcrm crm check`): `GET …/sobjects/{Contact|Lead|
Task}/describe` must list our field with `externalId` and `unique` true.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal
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
    MatchCandidates,
    OptOut,
    OptOutWritten,
    Survivor,
    fields_to_fill,
)
from inboxcrm.adapters.errors import Category, Classified
from inboxcrm.adapters.http import send_request
from inboxcrm.adapters.registry import (
    ConfigurationError,
    CrmProvider,
    Secrets,
    register,
    secret_value,
)
from inboxcrm.adapters.transport import AddressGuard, new_client
from inboxcrm.schemas.destinations import CrmDestination, SecretRef, SettingsBlock, field_name

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings

LAST_NAME_PLACEHOLDER = "[unknown]"
# The Contact's standard "Email Opt Out" checkbox.
OPT_OUT_FIELD = "HasOptedOutOfEmail"
NOTE_SUBJECT = "Inbound email (inboxcrm)"
DEFAULT_API_VERSION = "62.0"
SESSION_EXPIRED = "http_401:INVALID_SESSION_ID"
_ERROR_CODE = re.compile(r"^[A-Z][A-Z0-9_]{0,79}$")
_API_VERSION = re.compile(r"^\d{2,3}\.\d$")
_FIELD = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")


def _reason(response: httpx.Response) -> str | None:
    """`http_{status}:{errorCode}` from a Salesforce error array (payload-free)."""
    if response.status_code == 300:
        return "http_300:MULTIPLE_MATCHES"
    try:
        body = response.json()
    except ValueError:
        return None
    first = body[0] if isinstance(body, list) and body else body
    code = first.get("errorCode") if isinstance(first, dict) else None
    if isinstance(code, str) and _ERROR_CODE.match(code):
        return f"http_{response.status_code}:{code}"
    return None


def _oauth_reason(response: httpx.Response) -> str | None:
    """`http_{status}:{error}` from an OAuth error answer (`{"error": "invalid_client"}`)."""
    try:
        body = response.json()
    except ValueError:
        return None
    code = body.get("error") if isinstance(body, dict) else None
    if isinstance(code, str) and re.match(r"^[a-z_]{1,64}$", code):
        return f"http_{response.status_code}:{code}"
    return None


class ClientCredentials:
    """Access tokens from the OAuth 2.0 client credentials flow of a connected app:
    `POST {token_url}` with `grant_type=client_credentials`, `client_id`, `client_secret`
    (form-encoded); the answer's `access_token` is used as the Bearer token until Salesforce
    answers 401 INVALID_SESSION_ID, then renewed once (Salesforce's answer carries no expiry:
    the session lasts the org's session timeout, so the token is kept until refused).

    One token per adapter, shared by concurrent calls: a renewal happens once, however many
    calls met the expired one (the lock, and the stale token each caller presents)."""

    def __init__(self, token_url: str, client_id: str, client_secret: str,
                 timeout: float = 10.0, guard: AddressGuard | None = None) -> None:
        self._token_url = token_url
        self._form = {"grant_type": "client_credentials", "client_id": client_id,
                      "client_secret": client_secret}
        self._client = new_client(token_url, {}, timeout, guard)
        self._token: str | None = None
        self._lock = asyncio.Lock()
        self.fetched = 0  # tokens fetched (for tests and the adapter's own accounting)

    async def token(self) -> str:
        if self._token is not None:
            return self._token
        async with self._lock:
            if self._token is None:
                self._token = await self._fetch()
            return self._token

    async def renew(self, stale: str) -> str:
        """A new token, unless another call already replaced `stale`."""
        async with self._lock:
            if self._token is None or self._token == stale:
                self._token = None
                self._token = await self._fetch()
            return self._token

    async def _fetch(self) -> str:
        """The token request. Whatever goes wrong, the CRM call it was for was not sent:
        a failure is transient (retry) or permanent (the app's credentials), never unknown."""
        try:
            response = await send_request(self._client, "POST", self._token_url,
                                          data=self._form, reason=_oauth_reason)
        except AdapterError as exc:
            if exc.classified.category is Category.UNKNOWN:
                raise AdapterError(Classified(Category.TRANSIENT, exc.classified.reason,
                                              exc.classified.retry_after,
                                              exc.classified.status_code)) from None
            raise
        token = _json(response).get("access_token")
        if not isinstance(token, str) or not token:
            raise AdapterError(Classified(Category.TRANSIENT, "oauth_response_mismatch", None,
                                          response.status_code))
        self.fetched += 1
        return token

    async def aclose(self) -> None:
        await self._client.aclose()


NewProspects = Literal["contact", "lead"]
COMPANY_PLACEHOLDER = "[unknown]"
# A Lead's state: converted ones are followed to their Contact.
LEAD_STATE = ("Id", "IsConverted", "ConvertedContactId")
LEAD_KEY_PREFIX = "00Q"  # Salesforce's key prefix of Lead Ids (Contacts: 003)


def sobject_of(record_id: str) -> str:
    return "Lead" if record_id.startswith(LEAD_KEY_PREFIX) else "Contact"


def _converted_to(lead: dict[str, Any]) -> str | None:
    """The Contact a converted Lead became (`ConvertedContactId`), None if not converted."""
    target = lead.get("ConvertedContactId")
    if lead.get("IsConverted") is True and isinstance(target, str) and target:
        return target
    return None


_SOQL_ESCAPES = {"\\": "\\\\", "'": "\\'", '"': '\\"', "\n": "\\n", "\r": "\\r",
                 "\t": "\\t", "\b": "\\b", "\f": "\\f"}
MAX_CANDIDATES = 10
MAX_MERGE_HOPS = 5


def soql_quote(value: str) -> str:
    """A SOQL string literal: backslash, quotes and control characters escaped as SOQL's
    grammar requires, so no value can end the literal."""
    return "'" + "".join(_SOQL_ESCAPES.get(char, char) for char in value) + "'"


def _split_name(name: str | None) -> tuple[str | None, str]:
    if not name or not name.strip():
        return None, LAST_NAME_PLACEHOLDER
    # Split as the HubSpot adapter does: the first word, then the rest.
    first, _, last = name.strip().partition(" ")
    return first, last.strip() or LAST_NAME_PLACEHOLDER


class SalesforceCrm:
    name = "salesforce"

    def __init__(
        self,
        instance_url: str,
        token: str | None,
        *,
        external_id_field: str = "Inboxcrm_Contact_Id__c",
        company_field: str = "Inboxcrm_Company__c",
        note_external_id_field: str = "Inboxcrm_Note_Id__c",
        api_version: str = DEFAULT_API_VERSION,
        timeout: float = 10.0,
        oauth: ClientCredentials | None = None,
        guard: AddressGuard | None = None,
        new_prospects: NewProspects = "contact",
    ) -> None:
        version = api_version.removeprefix("v")
        if not _API_VERSION.match(version):
            raise ValueError(f"Salesforce API version must look like 62.0, got {api_version!r}")
        if not _FIELD.match(external_id_field):
            raise ValueError(f"invalid Salesforce external ID field {external_id_field!r}")
        if company_field and not _FIELD.match(company_field):
            raise ValueError(f"invalid Salesforce company field {company_field!r}")
        if not _FIELD.match(note_external_id_field):
            raise ValueError(f"invalid Salesforce note ID field {note_external_id_field!r}")
        # With OAuth the Bearer token is set per call (it is renewed); else a fixed one.
        headers = {"Authorization": f"Bearer {token}"} if token and oauth is None else {}
        self._client = new_client(instance_url, headers, timeout, guard)
        self._oauth = oauth
        self._field = external_id_field
        self._company_field = company_field
        self._note_field = note_external_id_field
        self._api = f"/services/data/v{version}"
        self._sobjects = f"{self._api}/sobjects"
        self._new_prospects: NewProspects = new_prospects

    @property
    def endpoint(self) -> str:
        """The base URL this client calls (no credentials): what a worker reports of its
        destinations (`Destinations.endpoints`)."""
        return str(self._client.base_url)

    def _path(self, external_id: str, sobject: str = "Contact") -> str:
        return f"{self._sobjects}/{sobject}/{self._field}/{quote(external_id, safe='')}"

    def _by_id(self, record_id: str) -> str:
        """The record's resource; its sObject told by the Id's key prefix (`00Q`: Lead)."""
        return f"{self._sobjects}/{sobject_of(record_id)}/{quote(record_id, safe='')}"

    def lead_fields(self, fields: ContactFields) -> dict[str, Any]:
        """A Lead's fields: the Contact's, with the standard `Company` (required on a Lead:
        the placeholder when the company is unknown) instead of the custom company field."""
        body = {k: v for k, v in self.fields(fields).items() if k != self._company_field}
        body["Company"] = fields.company or COMPANY_PLACEHOLDER
        return body

    def _note_path(self, note_key: str) -> str:
        return f"{self._sobjects}/Task/{self._note_field}/{quote(note_key, safe='')}"

    def fields(self, fields: ContactFields) -> dict[str, Any]:
        """The Contact fields sent for our contact (the external ID is in the URL only)."""
        first, last = _split_name(fields.name)
        body: dict[str, Any] = {"Email": fields.email, "LastName": last}
        if first:
            body["FirstName"] = first
        if self._company_field and fields.company:
            body[self._company_field] = fields.company
        return body

    async def upsert_contact(self, external_id: str, fields: ContactFields) -> CrmRecord:
        """Match before create: ours by External ID (a Contact, else a Lead: a converted one is
        followed to its Contact), else the one Contact or Lead with the email adopted, else
        created as the policy says (`new_prospects`; several matches: `MatchCandidates`)."""
        path, body = self._path(external_id), self.fields(fields)
        if await self._find(path) is not None:
            return await self._upsert(path, body)
        lead_path = self._path(external_id, "Lead")
        lead = await self._read(lead_path, LEAD_STATE)
        if lead is not None:
            converted = _converted_to(lead)
            if converted is not None:
                return await self._take_converted(converted, external_id, fields)
            return await self._upsert(lead_path, self.lead_fields(fields))
        adopted = await self._adopt(external_id, fields)
        if adopted is not None:
            return adopted
        if self._new_prospects == "lead":
            return await self._upsert(lead_path, self.lead_fields(fields))
        return await self._upsert(path, body)

    async def _take_converted(self, contact_id: str, external_id: str,
                              fields: ContactFields) -> CrmRecord:
        """Our Lead was converted: its Contact is the person's record from now on. Our ID is
        written onto it (unless it carries it already); one carrying another ID of ours is a
        person's call (`MatchCandidates`)."""
        record = await self._read(self._by_id(contact_id),
                                  ("Id", self._field, *self._adopt_fills()))
        if record is None:
            raise AdapterError(Classified(Category.PERMANENT, "converted_contact_missing"))
        if record.get(self._field) == external_id:
            return CrmRecord(record_id=contact_id, created=False)
        if record.get(self._field):
            raise MatchCandidates((contact_id,))
        return await self._mark(contact_id, record, external_id, fields)

    def _adopt_fills(self) -> tuple[str, ...]:
        """The fields an adoption may fill, and only where the record has them empty."""
        return ("FirstName", "LastName", *((self._company_field,) if self._company_field
                                           else ()))

    async def existing_by_email(self, email: str, sobject: str = "Contact"
                                ) -> list[dict[str, Any]]:
        """The Contacts (or Leads) holding `email` (Salesforce compares it
        case-insensitively)."""
        extra = LEAD_STATE[1:] if sobject == "Lead" else ()
        names = self._adopt_fills() if sobject == "Contact" else (
            "FirstName", "LastName", "Company")
        select = ", ".join(dict.fromkeys(("Id", "Email", self._field, *names, *extra)))
        # SOQL for Salesforce's query resource (not our store's SQL): built from words.
        query = " ".join(("SELECT", select, "FROM", sobject, "WHERE", "Email", "=",
                          soql_quote(email), "LIMIT", str(MAX_CANDIDATES + 1)))
        response = await self._call("GET", f"{self._api}/query", params={"q": query})
        records = _json(response).get("records")
        if not isinstance(records, list):
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                          response.status_code))
        return [r for r in records if isinstance(r, dict) and isinstance(r.get("Id"), str)]

    async def _adopt(self, external_id: str, fields: ContactFields) -> CrmRecord | None:
        """Adopt the one Contact or unconverted Lead with the email that carries no ID of
        ours (a converted Lead stands for its Contact); None: there is none, create."""
        email = fields.email
        contacts = await self.existing_by_email(email)
        free = {str(r["Id"]): r for r in contacts if not r.get(self._field)}
        taken = {str(r["Id"]) for r in contacts if r.get(self._field)}
        for lead in await self.existing_by_email(email, "Lead"):
            converted = _converted_to(lead)
            if converted is None:
                if not lead.get(self._field):
                    free[str(lead["Id"])] = lead
                continue
            if converted in free or converted in taken:
                continue
            # Converted into a Contact that no longer holds the email: follow it.
            record = await self._read(self._by_id(converted),
                                      ("Id", self._field, *self._adopt_fills()))
            if record is not None and not record.get(self._field):
                free[converted] = record
        if len(free) > 1:
            raise MatchCandidates(tuple(list(free)[:MAX_CANDIDATES]))
        if not free:
            return None
        [(record_id, record)] = free.items()
        return await self._mark(record_id, record, external_id, fields)

    async def _mark(self, record_id: str, record: dict[str, Any], external_id: str,
                    fields: ContactFields) -> CrmRecord:
        """Write our External ID onto a record a person created, with only the name and
        company fields the policy lets an adoption fill (`fields.fill`) that are empty on it;
        never `Email`, `OwnerId` or a field a person set."""
        update, _ = self._fill_update(record_id, record, fields, fields.fill)
        await self._call("PATCH", self._by_id(record_id),
                         json={self._field: external_id, **update})
        return CrmRecord(record_id=record_id, created=False, adopted=True, marked=True)

    def _fillable(self, record_id: str) -> tuple[str | None, tuple[str, ...]]:
        """The record's company field (a Lead's standard `Company`) and the fields a fill
        reads."""
        company = "Company" if sobject_of(record_id) == "Lead" else self._company_field
        return company, ("FirstName", "LastName", *((company,) if company else ()))

    def _fill_update(self, record_id: str, record: dict[str, Any], fields: ContactFields,
                     allowed: Collection[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The fields a fill-only write sends onto a record we did not create (the name
        counts as set when any part is; the placeholders count as empty), and our field
        names they are."""
        company, _ = self._fillable(record_id)
        empty = set()
        if (not record.get("FirstName")
                and record.get("LastName") in (None, "", LAST_NAME_PLACEHOLDER)):
            empty.add("name")
        if company and record.get(company) in (None, "", COMPANY_PLACEHOLDER):
            empty.add("company")
        fill = fields_to_fill(fields, allowed, empty)
        update: dict[str, Any] = {}
        if "name" in fill:
            first, last = _split_name(fill["name"])
            if first:
                update["FirstName"] = first
            if last != LAST_NAME_PLACEHOLDER:
                update["LastName"] = last
        if "company" in fill and company:
            update[company] = fill["company"]
        return update, tuple(fill)

    async def find_contact(self, external_id: str) -> CrmRecord | None:
        """GET by external ID: a record read, consistent right after a write (no search
        index). 404: no such record. 300 (several records) raises, as for the upsert. The
        Contact first, else our Lead (a converted one: its Contact)."""
        found = await self._find(self._path(external_id))
        if found is not None:
            return found
        lead = await self._read(self._path(external_id, "Lead"), LEAD_STATE)
        if lead is None:
            return None
        return CrmRecord(record_id=_converted_to(lead) or str(lead["Id"]))

    async def fill_contact(self, record_id: str, fields: ContactFields,
                           allowed: Collection[str]) -> Filled | None:
        _, names = self._fillable(record_id)
        record = await self._read(self._by_id(record_id), ("Id", *names))
        if record is None:
            return None
        update, filled = self._fill_update(record_id, record, fields, allowed)
        if update:
            await self._call("PATCH", self._by_id(record_id), json=update)
        return Filled(record_id=record_id, fields=filled)

    async def log_note(self, note_key: str, record_id: str, text: str,
                       occurred_at: datetime) -> str:
        """Log the inbound email as a completed Task on the Contact (`WhoId`, so the upsert
        itself associates it), dated the message's day; returns the Task Id."""
        body = {"WhoId": record_id, "Subject": NOTE_SUBJECT, "Description": text,
                "Status": "Completed", "ActivityDate": occurred_at.date().isoformat()}
        return (await self._upsert(self._note_path(note_key), body)).record_id

    async def associate_note(self, note_id: str, record_id: str) -> None:
        """The Task's `WhoId` is written by the same upsert that creates it: nothing to do."""

    async def find_note(self, note_key: str) -> str | None:
        found = await self._find(self._note_path(note_key))
        return found.record_id if found else None

    async def log_email(self, email_key: str, record_id: str, email: EmailActivity) -> str:
        """A completed Task on the Contact (`WhoId`) as Salesforce logs an email ("Email:
        <subject>"), upserted by our external ID on Task, dated the message's day."""
        body = {"WhoId": record_id, "Subject": f"Email: {email.subject}"[:255],
                "Description": email.text, "Status": "Completed",
                "ActivityDate": email.occurred_at.date().isoformat()}
        return (await self._upsert(self._note_path(email_key), body)).record_id

    async def find_email(self, email_key: str) -> str | None:
        return await self.find_note(email_key)

    async def read_contact(self, record_id: str) -> CrmRecordView | None:
        """GET the Contact by its Salesforce Id with our external ID field."""
        response = await self._call(
            "GET", self._by_id(record_id),
            params={"fields": f"Id,{self._field}"}, passthrough=(404,))
        if response.status_code == 404:
            return None
        body = _json(response)
        found = body.get("Id") or body.get("id")
        if not isinstance(found, str) or not found:
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                          response.status_code))
        owner = body.get(self._field)
        return CrmRecordView(record_id=found, external_id=str(owner) if owner else None)

    follows_notes = False  # the old ID's read names the survivor

    async def survivor_of(self, record_id: str, external_id: str | None = None,
                          notes: tuple[str, ...] = ()) -> Survivor | None:
        """A merged Contact or Lead is deleted and names its survivor in `MasterRecordId`,
        which only `queryAll` shows (`SELECT Id, IsDeleted, MasterRecordId FROM Contact|Lead
        WHERE Id = '…'`, a record read); a Lead a salesperson converted stands for its
        Contact (`IsConverted`, `ConvertedContactId`, read by the same query). A master merged
        or converted in turn is followed, `MAX_MERGE_HOPS` at most."""
        current = record_id
        for _ in range(MAX_MERGE_HOPS):
            sobject = sobject_of(current)
            extra = (", " + ", ".join(LEAD_STATE[1:])) if sobject == "Lead" else ""
            query = " ".join(("SELECT", f"Id, IsDeleted, MasterRecordId{extra}", "FROM",
                              sobject, "WHERE", "Id", "=", soql_quote(current)))
            response = await self._call("GET", f"{self._api}/queryAll", params={"q": query})
            records = _json(response).get("records")
            if not isinstance(records, list):
                raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                              response.status_code))
            first = records[0] if records and isinstance(records[0], dict) else {}
            master = first.get("MasterRecordId")
            if first.get("IsDeleted") is True and isinstance(master, str) and master:
                current = master
            elif sobject == "Lead" and (converted := _converted_to(first)) is not None:
                current = converted
            else:
                break
        if current == record_id:
            return None
        record = await self._read(self._by_id(current), ("Id", self._field))
        if record is None:
            return None
        held = record.get(self._field)
        return Survivor(record_id=current, external_id=str(held) if held else None)

    async def claim_survivor(self, survivor: Survivor, external_id: str) -> bool:
        if survivor.external_id:
            return survivor.external_id == external_id
        await self._call("PATCH", self._by_id(survivor.record_id),
                         json={self._field: external_id})
        return True

    consent_field = OPT_OUT_FIELD

    async def read_opt_out(self, record_id: str) -> OptOut:
        """`HasOptedOutOfEmail` of the Contact, read by Id (a record read)."""
        response = await self._call(
            "GET", self._by_id(record_id), params={"fields": f"Id,{OPT_OUT_FIELD}"})
        value = _json(response).get(OPT_OUT_FIELD)
        return OptOut(record_id=record_id, field=OPT_OUT_FIELD,
                      opted_out=value is True or str(value).lower() == "true")

    async def write_opt_out(self, email: str, record_id: str | None) -> OptOutWritten:
        """`PATCH …/sobjects/Contact/{Id}` `{"HasOptedOutOfEmail": true}` on our Contact, or,
        when we never reached the CRM with this person, on every Contact holding the address
        (an opt-out is the person's, whichever record a salesperson keeps). Only that field
        is sent; repeating it changes nothing."""
        if record_id:
            targets = [record_id]
        else:
            targets = [str(r["Id"]) for r in await self.existing_by_email(email)]
            targets += [str(r["Id"]) for r in await self.existing_by_email(email, "Lead")
                        if _converted_to(r) is None]
        for target in targets[:MAX_CANDIDATES]:
            await self._call("PATCH", self._by_id(target), json={OPT_OUT_FIELD: True})
        return OptOutWritten(field=OPT_OUT_FIELD, record_ids=tuple(targets[:MAX_CANDIDATES]))

    async def check_external_id(self) -> tuple[GuaranteeCheck, ...]:
        """`GET …/sobjects/{Contact|Lead|Task}/describe`: our ID field on Contact and Lead
        (Leads are matched and adopted whatever the policy creates) and the note's on Task
        exist, are External IDs (`externalId`) and are unique (`unique`)."""
        checks = []
        for sobject, field, setting in (("Contact", self._field, "external_id_field"),
                                        ("Lead", self._field, "external_id_field"),
                                        ("Task", self._note_field, "note_external_id_field")):
            response = await self._call("GET", f"{self._sobjects}/{sobject}/describe")
            fields = _json(response).get("fields")
            if not isinstance(fields, list):
                raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                              response.status_code))
            found = next((f for f in fields if isinstance(f, dict) and f.get("name") == field),
                         None)
            checks.append(GuaranteeCheck(self.name, sobject, field,
                                         _field_problem(sobject, field, setting, found)))
        return tuple(checks)

    async def _upsert(self, path: str, body: dict[str, Any]) -> CrmRecord:
        response = await self._call("PATCH", path, json=body)
        if response.status_code == 204:
            # Updated (API versions before 46.0 answer without a body): read the Id back.
            found = await self._find(path)
            if found is None:
                raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None, 204))
            return CrmRecord(record_id=found.record_id, created=False)
        record_id = _record_id(response)
        if record_id is None:
            # Success without the record: we cannot tell what the CRM did.
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                          response.status_code))
        created = _json(response).get("created")
        return CrmRecord(record_id=record_id,
                         created=created if isinstance(created, bool)
                         else response.status_code == 201)

    async def _find(self, path: str) -> CrmRecord | None:
        response = await self._call("GET", path, params={"fields": "Id"}, passthrough=(404,))
        if response.status_code == 404:
            return None
        body = _json(response)
        record_id = body.get("Id") or body.get("id")
        if not isinstance(record_id, str) or not record_id:
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                          response.status_code))
        return CrmRecord(record_id=record_id)

    async def _read(self, path: str, fields: tuple[str, ...]) -> dict[str, Any] | None:
        """The record at `path` with `fields` (404: None; 300: raises, as `_find`)."""
        response = await self._call("GET", path, params={"fields": ",".join(fields)},
                                    passthrough=(404,))
        if response.status_code == 404:
            return None
        body = _json(response)
        if not isinstance(body.get("Id"), str) or not body["Id"]:
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                          response.status_code))
        return body

    async def _call(self, method: str, path: str, *, json: Any = None,
                    params: dict[str, str] | None = None,
                    passthrough: tuple[int, ...] = ()) -> httpx.Response:
        """One REST call; with OAuth, an expired session is renewed once and the call
        repeated (a 401 changed nothing, and every write here is an idempotent upsert)."""
        if self._oauth is None:
            return await send_request(self._client, method, path, json=json, params=params,
                                      passthrough=passthrough, reason=_reason)
        token = await self._oauth.token()
        try:
            return await send_request(self._client, method, path, json=json, params=params,
                                      headers={"Authorization": f"Bearer {token}"},
                                      passthrough=passthrough, reason=_reason)
        except AdapterError as exc:
            if exc.classified.reason != SESSION_EXPIRED:
                raise
        token = await self._oauth.renew(token)
        return await send_request(self._client, method, path, json=json, params=params,
                                  headers={"Authorization": f"Bearer {token}"},
                                  passthrough=passthrough, reason=_reason)

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._oauth is not None:
            await self._oauth.aclose()


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _field_problem(sobject: str, field: str, setting: str,
                   found: dict[str, Any] | None) -> str | None:
    """One line naming the field and what to do, or None when it holds the guarantee."""
    where = f"Setup > Object Manager > {sobject} > Fields & Relationships"
    if found is None:
        return (f"Salesforce {sobject}.{field} does not exist: create it ({where}) as a Text "
                f"field with External ID and Unique ticked, or name another in "
                f"destinations.crm.{setting}")
    if found.get("externalId") is not True:
        return (f"Salesforce {sobject}.{field} is not an External ID field: edit it ({where}) "
                "and tick External ID and Unique")
    if found.get("unique") is not True:
        return (f"Salesforce {sobject}.{field} is not unique: edit it ({where}) and tick "
                f"Unique (after removing duplicate values), or name a unique External ID "
                f"field in destinations.crm.{setting}")
    return None


def _record_id(response: httpx.Response) -> str | None:
    """The Id from the upsert answer's body, else from its Location header."""
    record_id = _json(response).get("id")
    if isinstance(record_id, str) and record_id:
        return record_id
    location = response.headers.get("location", "").rstrip("/")
    tail = location.rpartition("/")[2]
    return tail or None


# --- the provider ----------------------------------------------------------------------------
class SalesforceOAuth(SettingsBlock):
    """The OAuth 2.0 client credentials flow of a Salesforce connected app: the adapter
    fetches its own access token and renews it when Salesforce answers INVALID_SESSION_ID."""

    flow: Literal["client_credentials"] = "client_credentials"
    client_id: str | SecretRef  # the connected app's consumer key: not a secret by itself
    client_secret: SecretRef
    # Default: `{instance url}/services/oauth2/token` (the org's My Domain, where Salesforce
    # requires the client credentials flow to be called).
    token_url: str | None = None


class SalesforceDestination(CrmDestination):
    """A tenant's Salesforce org (`destinations.crm` with `"provider": "salesforce"`); unset
    fields: the global `INBOXCRM_SALESFORCE_*` settings."""

    # Salesforce's hosts: an org's My Domain (`<name>.my.salesforce.com`, sandboxes
    # `<name>--<box>.sandbox.my.salesforce.com`) and login/test.salesforce.com for tokens.
    documented_hosts: ClassVar[tuple[str, ...]] = ("*.my.salesforce.com", "*.salesforce.com")
    url: str | None = None           # the instance (My Domain) URL: required
    token: SecretRef | None = None   # a fixed access token (no renewal; prefer `oauth`)
    oauth: SalesforceOAuth | None = None
    external_id_field: str | None = None
    company_field: str | None = None
    note_external_id_field: str | None = None
    api_version: str | None = None
    # What a new prospect becomes (a person no Contact or Lead holds yet): `contact` (the
    # default, as before) or `lead`. An existing Contact or Lead is matched either way.
    new_prospects: NewProspects = "contact"

    @field_validator("external_id_field", "note_external_id_field")
    @classmethod
    def _field_name(cls, value: str | None) -> str | None:
        return field_name(value)

    def endpoints(self) -> list[tuple[str, str]]:
        found = [("url", self.url)] if self.url else []
        if self.oauth is not None and self.oauth.token_url:
            found.append(("oauth.token_url", self.oauth.token_url))
        return found

    @model_validator(mode="after")
    def _complete(self) -> SalesforceDestination:
        if not self.url:
            raise ValueError("a salesforce destination needs its instance url")
        if self.oauth is None and self.token is None:
            raise ValueError("a salesforce destination needs oauth (or a token)")
        return self


@register
class SalesforceProvider(CrmProvider[SalesforceDestination]):
    name = SalesforceCrm.name
    destination = SalesforceDestination
    sandbox = ("inboxcrm/sandbox/salesforce.py",)
    conformance = "tests/conformance/test_salesforce.py"

    def from_settings(self, settings: Settings) -> SalesforceCrm:
        url = settings.salesforce_instance_url
        if not url:
            raise ConfigurationError(
                "INBOXCRM_SALESFORCE_INSTANCE_URL is required for the salesforce provider")
        client_id = settings.salesforce_client_id
        client_secret = secret_value(settings.salesforce_client_secret)
        if bool(client_id) != bool(client_secret):
            raise ConfigurationError("INBOXCRM_SALESFORCE_CLIENT_ID and "
                                     "INBOXCRM_SALESFORCE_CLIENT_SECRET go together")
        oauth = (settings.salesforce_token_url, client_id, client_secret) \
            if client_id and client_secret else None
        return self._build(url, secret_value(settings.salesforce_token), oauth, settings)

    def from_destination(self, spec: SalesforceDestination, settings: Settings,
                         secrets: Secrets) -> SalesforceCrm:
        assert spec.url is not None  # the destination requires it
        oauth = None
        if spec.oauth is not None:
            client_id = (spec.oauth.client_id if isinstance(spec.oauth.client_id, str)
                         else secrets.get(spec.oauth.client_id, "oauth.client_id"))
            oauth = (spec.oauth.token_url, client_id,
                     secrets.get(spec.oauth.client_secret, "oauth.client_secret"))
        return self._build(
            spec.url, secrets.optional(spec.token, "token"), oauth, settings,
            external_id_field=spec.external_id_field, company_field=spec.company_field,
            note_external_id_field=spec.note_external_id_field, api_version=spec.api_version,
            guard=secrets.guard, new_prospects=spec.new_prospects)

    @staticmethod
    def _build(url: str, token: str | None, oauth: tuple[str | None, str, str] | None,
               settings: Settings, *, external_id_field: str | None = None,
               company_field: str | None = None, note_external_id_field: str | None = None,
               api_version: str | None = None, guard: AddressGuard | None = None,
               new_prospects: NewProspects = "contact") -> SalesforceCrm:
        """The one construction of the adapter: unset fields are the global settings'."""
        timeout = settings.http_timeout_seconds
        credentials = None
        if oauth is not None:
            token_url, client_id, client_secret = oauth
            credentials = ClientCredentials(
                token_url or f"{url.rstrip('/')}/services/oauth2/token", client_id,
                client_secret, timeout, guard)
        return SalesforceCrm(
            url, token,
            external_id_field=external_id_field or settings.salesforce_external_id_field,
            company_field=(company_field if company_field is not None
                           else settings.salesforce_company_field),
            note_external_id_field=(note_external_id_field
                                    or settings.salesforce_note_external_id_field),
            api_version=api_version or settings.salesforce_api_version, timeout=timeout,
            oauth=credentials, guard=guard, new_prospects=new_prospects)
