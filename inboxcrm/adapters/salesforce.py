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
company fields that are empty on it (`ADOPT_FILLS`), never `OwnerId` or a field a person set;
several → `MatchCandidates` (a person picks). Records that carry another of our IDs are not
candidates. Our own writers are serialised by the contact row lock; what this read cannot
rule out is a person creating the same Contact in Salesforce's UI between the read and the
write (docs/architecture.md §5, "Activities").
"""

from __future__ import annotations

import asyncio
import re
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
    MatchCandidates,
    OptOut,
    OptOutWritten,
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


_SOQL_ESCAPES = {"\\": "\\\\", "'": "\\'", '"': '\\"', "\n": "\\n", "\r": "\\r",
                 "\t": "\\t", "\b": "\\b", "\f": "\\f"}
MAX_CANDIDATES = 10


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

    def _path(self, external_id: str) -> str:
        return f"{self._sobjects}/Contact/{self._field}/{quote(external_id, safe='')}"

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
        """Match before create: ours by External ID, else one Contact with the email adopted,
        else created (several: `MatchCandidates`)."""
        path, body = self._path(external_id), self.fields(fields)
        if await self._find(path) is None:
            adopted = await self._adopt(external_id, body)
            if adopted is not None:
                return adopted
        return await self._upsert(path, body)

    def _adopt_fills(self) -> tuple[str, ...]:
        """The fields an adoption may fill, and only where the record has them empty."""
        return ("FirstName", "LastName", *((self._company_field,) if self._company_field
                                           else ()))

    async def existing_by_email(self, email: str) -> list[dict[str, Any]]:
        """The Contacts holding `email` (Salesforce compares it case-insensitively)."""
        select = ", ".join(dict.fromkeys(("Id", "Email", self._field, *self._adopt_fills())))
        # SOQL for Salesforce's query resource (not our store's SQL): built from words.
        query = " ".join(("SELECT", select, "FROM", "Contact", "WHERE", "Email", "=",
                          soql_quote(email), "LIMIT", str(MAX_CANDIDATES + 1)))
        response = await self._call("GET", f"{self._api}/query", params={"q": query})
        records = _json(response).get("records")
        if not isinstance(records, list):
            raise AdapterError(Classified(Category.UNKNOWN, "response_mismatch", None,
                                          response.status_code))
        return [r for r in records if isinstance(r, dict) and isinstance(r.get("Id"), str)]

    async def _adopt(self, external_id: str, body: dict[str, Any]) -> CrmRecord | None:
        """Adopt the one Contact with the email that carries no ID of ours; None: there is
        none, create."""
        found = await self.existing_by_email(str(body["Email"]))
        free = [r for r in found if not r.get(self._field)]
        if len(free) > 1:
            raise MatchCandidates(tuple(str(r["Id"]) for r in free[:MAX_CANDIDATES]))
        if not free:
            return None
        record = free[0]
        update: dict[str, Any] = {self._field: external_id}
        for name in self._adopt_fills():
            empty = record.get(name) in (None, "")
            if empty and body.get(name) and body[name] != LAST_NAME_PLACEHOLDER:
                update[name] = body[name]
        record_id = str(record["Id"])
        await self._call("PATCH", f"{self._sobjects}/Contact/{quote(record_id, safe='')}",
                         json=update)
        return CrmRecord(record_id=record_id, created=False, adopted=True, marked=True)

    async def find_contact(self, external_id: str) -> CrmRecord | None:
        """GET by external ID: a record read, consistent right after a write (no search
        index). 404: no such record. 300 (several records) raises, as for the upsert."""
        return await self._find(self._path(external_id))

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
            "GET", f"{self._sobjects}/Contact/{quote(record_id, safe='')}",
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

    consent_field = OPT_OUT_FIELD

    async def read_opt_out(self, record_id: str) -> OptOut:
        """`HasOptedOutOfEmail` of the Contact, read by Id (a record read)."""
        response = await self._call(
            "GET", f"{self._sobjects}/Contact/{quote(record_id, safe='')}",
            params={"fields": f"Id,{OPT_OUT_FIELD}"})
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
        for target in targets[:MAX_CANDIDATES]:
            await self._call("PATCH", f"{self._sobjects}/Contact/{quote(target, safe='')}",
                             json={OPT_OUT_FIELD: True})
        return OptOutWritten(field=OPT_OUT_FIELD, record_ids=tuple(targets[:MAX_CANDIDATES]))

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
            guard=secrets.guard)

    @staticmethod
    def _build(url: str, token: str | None, oauth: tuple[str | None, str, str] | None,
               settings: Settings, *, external_id_field: str | None = None,
               company_field: str | None = None, note_external_id_field: str | None = None,
               api_version: str | None = None, guard: AddressGuard | None = None
               ) -> SalesforceCrm:
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
            oauth=credentials, guard=guard)
