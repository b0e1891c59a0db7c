"""Pipedrive CRM adapter (API v1): persons and notes, a CRM without upsert by external ID.

Pipedrive keeps nothing unique but its own person ID: not the email (several persons may
hold one), not a custom field. So the design's harder case applies ("keep the mapping in the
integration store and treat a CRM create as an operation that must be reconciled after
failure"): the person's ID, once known, is kept on our contact row (the CRM step's
`crm_record_id`), and before any create the adapter asks Pipedrive what it already holds:

1. our ID: `GET /v1/persons/search?term={contact id}&fields=custom_fields&exact_match=true`
   on the custom person field holding our external ID (default name `inboxcrm contact ID`,
   a *Text* field; its 40-character key is looked up by name with `GET /v1/personFields`
   and kept), each hit confirmed by `GET /v1/persons/{id}`; the search is an index, so on a
   miss the newest persons are read too (`GET /v1/persons?sort=id DESC&limit=100`, a record
   read): a person we created seconds ago is there before the index has it. Found: it is
   ours, nothing is created. This is also the CRM step's reconciliation after an unknown
   outcome (a create that timed out after Pipedrive committed it): the runner looks the
   person up by our ID before it attempts again, and the attempt itself looks again, so a
   second create happens only when Pipedrive holds no person with our ID.
2. the email: `…/persons/search?term={email}&fields=email&exact_match=true`. One person
   without an ID of ours is adopted: `PUT /v1/persons/{id}` with our ID in the custom field
   and `first_name`/`last_name` only when the person has no name and the policy allows the
   name; never `owner_id`, never what a salesperson set. Several → `MatchCandidates`
   (review with the candidates).
   Later writes to a person we did not create (adopted) are `fill_contact`: the person read
   by ID (`GET /v1/persons/{id}`, no search), then `PUT` of `first_name`/`last_name` only
   when the person has no name of a person's (policy allowing `name`); the company is an
   organization (`org_id`), a lookup we never write. Persons we created are not written
   again after the create (as before).
3. none: `POST /v1/persons` (`name`, `email`, our ID in the custom field; no owner, so the
   person is the API token's user's, as Pipedrive assigns).

What this cannot rule out: Pipedrive's search is an index, so a person a salesperson typed
in seconds ago may not be found by email yet (and ours, after an ambiguous create, only by
the newest-persons read, if fewer than 100 persons were created since); docs/architecture.md
§5 ("Activities") says what that leaves open.

The inbound email is a note (`POST /v1/notes`, HTML `content`, `person_id`, `add_time` the
message's date in UTC). Notes have no external ID either: the content ends with the note's
key, and a log first lists the person's notes (`GET /v1/notes?person_id=`, a record read)
and returns the one carrying the key, so a retry never logs the email twice;
reconciliation without the person reads the company's newest notes (`GET /v1/notes?sort=id
DESC`), then the persons search on `notes`.

Merges (`CrmMerges`): a person merged away in Pipedrive (`PUT /v1/persons/{id}/merge` with
`merge_with_id`, the survivor) is removed; Pipedrive's merge keeps the survivor's values and
moves the merged person's into the survivor's empty fields, our ID field among them. So a
stored person that no longer answers (`GET /v1/persons/{id}`: 404, or inactive) is followed
to the person carrying our ID (`find_contact`); one merged into a person carrying another
ID of ours (ours did not move) is found where the notes we logged on it went
(`GET /v1/notes/{id}`: the merge moved them to the survivor) and named with that other ID,
which the CRM step sends to review; gone with no trace, the next upsert matches by email
as for a new contact. Pipedrive's docs do not say what a read of a merged-away ID answers; the
adapter needs only that it does not answer as an active person.

Consent (`CrmConsent`): the person's `marketing_status` (`subscribed`, `unsubscribed`,
`no_consent`, `archived`; Campaigns' field, shown on every person): `unsubscribed` is an
opt-out; inboxcrm's own suppressions set it to `unsubscribed` by `PUT /v1/persons/{id}`.

Auth: the API token in the `x-api-token` header (Pipedrive also takes `?api_token=`; a
header keeps the token out of URLs and access logs). Errors are `{"success": false,
"error", "errorCode"}`; a 429 carries `x-ratelimit-reset` (seconds until the window
resets), which is the retry delay; `success: false` on a 2xx is an unknown outcome.
"""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import httpx
from pydantic import field_validator, model_validator

from inboxcrm.adapters.base import (
    AdapterError,
    ContactFields,
    CrmRecord,
    CrmRecordView,
    EmailActivity,
    Filled,
    MatchCandidates,
    OptOut,
    OptOutWritten,
    Survivor,
    fields_to_fill,
)
from inboxcrm.adapters.errors import Category, Classified, parse_retry_after
from inboxcrm.adapters.http import send_request
from inboxcrm.adapters.registry import (
    ConfigurationError,
    CrmProvider,
    Secrets,
    register,
    secret_value,
)
from inboxcrm.adapters.transport import AddressGuard, new_client
from inboxcrm.schemas.destinations import CrmDestination, SecretRef

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings

PIPEDRIVE_API = "https://api.pipedrive.com"
DEFAULT_EXTERNAL_ID_FIELD = "inboxcrm contact ID"
OPT_OUT_FIELD = "marketing_status"
OPTED_OUT = "unsubscribed"
MAX_CANDIDATES = 10
# How far back (newest notes of the company) a lookup of a note looks past the index.
RECENT_PERSONS = 100
# A lookup by our ID reads every person added in the last RECENT_WINDOW past the index (a
# create of ours the search does not show yet), RECENT_PAGE at a time, at most RECENT_PAGES
# pages: a company that added more than that in the window is an unknown outcome, never
# "not there" (docs/crm.md, Pipedrive).
RECENT_WINDOW = timedelta(minutes=30)
RECENT_PAGE = 500
RECENT_PAGES = 20
# Custom field types Pipedrive's search looks into (Persons search, `fields`).
SEARCHABLE_TYPES = frozenset({"varchar", "text", "varchar_auto", "address", "double",
                              "monetary", "phone"})
NOTE_MARK = "inboxcrm note "
_FIELD_KEY = re.compile(r"^[0-9a-f]{40}$")
_FIELD_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,99}$")


def _unknown(status: int, reason: str = "response_mismatch") -> AdapterError:
    return AdapterError(Classified(Category.UNKNOWN, reason, None, status))


def _data(response: httpx.Response) -> Any:
    """`data` of a `{"success": true, "data": …}` answer; anything else is a mismatch (we
    cannot tell what Pipedrive did)."""
    try:
        body = response.json()
    except ValueError:
        raise _unknown(response.status_code) from None
    if not isinstance(body, dict) or body.get("success") is not True:
        raise _unknown(response.status_code)
    return body.get("data")


def _split_name(name: str | None) -> tuple[str | None, str | None]:
    if not name or not name.strip():
        return None, None
    first, _, last = name.strip().partition(" ")
    return first or None, last.strip() or None


class PipedriveCrm:
    name = "pipedrive"
    # No upsert by our ID: a lookup, then a create (base.CreatesByLookup).
    creates_by_lookup = True

    def __init__(self, base_url: str, token: str | None, *,
                 external_id_field: str = DEFAULT_EXTERNAL_ID_FIELD, timeout: float = 10.0,
                 guard: AddressGuard | None = None) -> None:
        if not (_FIELD_KEY.match(external_id_field) or _FIELD_LABEL.match(external_id_field)):
            raise ValueError("invalid Pipedrive external ID field (a field name or key)")
        headers = {"x-api-token": token} if token else {}
        self._client = new_client(base_url, headers, timeout, guard)
        self._field = external_id_field
        self._key: str | None = external_id_field if _FIELD_KEY.match(external_id_field) \
            else None
        self._key_lock = asyncio.Lock()

    @property
    def endpoint(self) -> str:
        """The base URL this client calls (no credentials): what a worker reports of its
        destinations (`Destinations.endpoints`)."""
        return str(self._client.base_url)

    # --- plumbing --------------------------------------------------------------------------
    async def _call(self, method: str, path: str, *, json: Any = None,
                    params: dict[str, str] | None = None,
                    passthrough: tuple[int, ...] = ()) -> httpx.Response:
        response = await send_request(self._client, method, path, json=json, params=params,
                                      passthrough=(*passthrough, 429))
        if response.status_code == 429:
            # Pipedrive's window: `x-ratelimit-reset` seconds (Retry-After where sent).
            delay = parse_retry_after(response.headers.get("x-ratelimit-reset")
                                      or response.headers.get("retry-after"))
            raise AdapterError(Classified(Category.TRANSIENT, "http_429:rate_limit",
                                          delay if delay is not None else 2.0, 429))
        return response

    async def field_key(self) -> str:
        """The 40-character key of our custom person field (looked up by name once)."""
        if self._key is not None:
            return self._key
        async with self._key_lock:
            if self._key is None:
                fields = _data(await self._call("GET", "/v1/personFields"))
                found = [f for f in fields or [] if isinstance(f, dict)
                         and str(f.get("name", "")).lower() == self._field.lower()]
                if not found:
                    raise AdapterError(Classified(Category.PERMANENT,
                                                  "pipedrive_field_missing"))
                if found[0].get("field_type") not in SEARCHABLE_TYPES:
                    raise AdapterError(Classified(Category.PERMANENT,
                                                  "pipedrive_field_not_searchable"))
                self._key = str(found[0]["key"])
            return self._key

    async def _search(self, term: str, fields: str, exact: bool = True) -> list[int]:
        """Person IDs the search finds (the first page: more than a handful is a review)."""
        params = {"term": term, "fields": fields, "limit": str(MAX_CANDIDATES + 1)}
        if exact:
            params["exact_match"] = "true"
        data = _data(await self._call("GET", "/v1/persons/search", params=params))
        items = data.get("items") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise _unknown(200)
        found = [i.get("item", {}).get("id") for i in items if isinstance(i, dict)]
        return [int(f) for f in found if isinstance(f, int)]

    async def _person(self, person_id: int | str) -> dict[str, Any] | None:
        response = await self._call("GET", f"/v1/persons/{int(person_id)}", passthrough=(404,))
        if response.status_code == 404:
            return None
        person = _data(response)
        if not isinstance(person, dict) or not isinstance(person.get("id"), int):
            raise _unknown(response.status_code)
        if person.get("active_flag") is False:  # deleted (kept 30 days, then gone)
            return None
        return person

    async def _persons(self, ids: list[int]) -> list[dict[str, Any]]:
        found = [await self._person(i) for i in ids[:MAX_CANDIDATES + 1]]
        return [p for p in found if p is not None]

    # --- contacts --------------------------------------------------------------------------
    async def _recent(self, key: str, external_id: str) -> list[dict[str, Any]]:
        """The persons added in the last RECENT_WINDOW carrying our ID (`GET /v1/persons?sort=
        add_time DESC`, a record read, not the index): where a person we created a moment
        ago is before the search has it. By `add_time`, not ID: an import may set a person's
        `add_time` back, never ours (we send none). The whole window is read, however many
        others the company's users and integrations added meanwhile; one that cannot be read
        to its end is an unknown outcome, so an ambiguous create is never repeated on a
        guess."""
        since = datetime.now(UTC) - RECENT_WINDOW
        ours: list[dict[str, Any]] = []
        for page in range(RECENT_PAGES):
            response = await self._call("GET", "/v1/persons", params={
                "sort": "add_time DESC", "start": str(page * RECENT_PAGE),
                "limit": str(RECENT_PAGE)})
            listed = _data(response) or []
            if not isinstance(listed, list):
                raise _unknown(response.status_code)
            persons = [p for p in listed if isinstance(p, dict) and isinstance(p.get("id"), int)]
            ours += [p for p in persons if str(p.get(key) or "") == external_id
                     and p.get("active_flag") is not False]
            more = ((response.json().get("additional_data") or {}).get("pagination") or {}
                    ).get("more_items_in_collection")
            oldest = _added(persons[-1]) if persons else None
            if not more or (oldest is not None and oldest < since):
                return ours
        raise _unknown(200, "pipedrive_recent_persons_unread")

    async def find_contact(self, external_id: str) -> CrmRecord | None:
        """The person carrying our ID: the search on custom fields (hits confirmed by a
        read), else the newest persons (a create of ours the index does not show yet). Two
        persons with our ID would be a duplicate nothing may pick between: blocked."""
        key = await self.field_key()
        persons = await self._persons(await self._search(external_id, "custom_fields"))
        ours = [p for p in persons if str(p.get(key) or "") == external_id]
        if not ours:
            ours = await self._recent(key, external_id)
        if len(ours) > 1:
            raise AdapterError(Classified(Category.PERMANENT, "pipedrive_duplicate_external_id"))
        return CrmRecord(record_id=str(ours[0]["id"]), created=False) if ours else None

    async def fill_contact(self, record_id: str, fields: ContactFields,
                           allowed: Collection[str]) -> Filled | None:
        person = await self._person(record_id)
        if person is None:
            return None
        update, filled = _fill_update(person, fields, allowed)
        if update:
            await self._call("PUT", f"/v1/persons/{int(person['id'])}", json=update)
        return Filled(record_id=str(person["id"]), fields=filled)

    async def upsert_contact(self, external_id: str, fields: ContactFields) -> CrmRecord:
        """Ours by our ID, else the one person with the email adopted, else created."""
        found = await self.find_contact(external_id)
        if found is not None:
            return found
        key = await self.field_key()
        first, last = _split_name(fields.name)
        existing = await self._persons(await self._search(fields.email, "email"))
        free = [p for p in existing if not p.get(key) and _holds(p, fields.email)]
        if len(free) > 1:
            raise MatchCandidates(tuple(str(p["id"]) for p in free[:MAX_CANDIDATES]))
        if free:
            person = free[0]
            update, _ = _fill_update(person, fields, fields.fill)
            await self._call("PUT", f"/v1/persons/{person['id']}",
                             json={key: external_id, **update})
            return CrmRecord(record_id=str(person["id"]), created=False, adopted=True,
                             marked=True)
        body: dict[str, Any] = {
            "name": fields.name.strip() if fields.name and fields.name.strip()
            else fields.email,
            "email": [{"value": fields.email, "primary": True, "label": "work"}],
            key: external_id}
        if first:
            body["first_name"] = first
        if last:
            body["last_name"] = last
        created = _data(await self._call("POST", "/v1/persons", json=body))
        if not isinstance(created, dict) or not isinstance(created.get("id"), int):
            raise _unknown(201)
        return CrmRecord(record_id=str(created["id"]), created=True)

    async def read_contact(self, record_id: str) -> CrmRecordView | None:
        if not record_id.isdigit():
            return None
        person = await self._person(record_id)
        if person is None:
            return None
        held = person.get(await self.field_key())
        return CrmRecordView(record_id=str(person["id"]), external_id=str(held) if held
                             else None)

    # --- notes -----------------------------------------------------------------------------
    async def _note_on(self, person_id: str, note_key: str) -> str | None:
        """The person's note carrying `note_key` (a list of the person's notes)."""
        start = 0
        while True:
            response = await self._call("GET", "/v1/notes", params={
                "person_id": person_id, "start": str(start), "limit": "500"})
            notes = _data(response) or []  # Pipedrive answers no notes as `data: null`
            if not isinstance(notes, list):
                raise _unknown(response.status_code)
            for note in notes:
                if isinstance(note, dict) and f"{NOTE_MARK}{note_key}" in str(
                        note.get("content") or ""):
                    return str(note["id"])
            more = (response.json().get("additional_data") or {}).get("pagination") or {}
            if not more.get("more_items_in_collection"):
                return None
            start += 500

    async def log_note(self, note_key: str, record_id: str, text: str,
                       occurred_at: datetime) -> str:
        """The email as a note on the person, once: an existing note with the key is it."""
        found = await self._note_on(record_id, note_key)
        if found is not None:
            return found
        content = (f"<p>{html.escape(text)}</p>"
                   f"<p><small>{NOTE_MARK}{html.escape(note_key)}</small></p>")
        stamp = occurred_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
        note = _data(await self._call("POST", "/v1/notes", json={
            "content": content, "person_id": int(record_id), "add_time": stamp}))
        if not isinstance(note, dict) or not isinstance(note.get("id"), int):
            raise _unknown(201)
        return str(note["id"])

    async def find_note(self, note_key: str) -> str | None:
        """The newest notes of the company first (`GET /v1/notes?sort=id DESC`, a record
        read: a note logged seconds ago is there), then the persons search on `notes`."""
        response = await self._call("GET", "/v1/notes", params={
            "sort": "id DESC", "start": "0", "limit": str(RECENT_PERSONS)})
        notes = _data(response) or []
        if not isinstance(notes, list):
            raise _unknown(response.status_code)
        for note in notes:
            if isinstance(note, dict) and f"{NOTE_MARK}{note_key}" in str(
                    note.get("content") or ""):
                return str(note["id"])
        for person_id in await self._search(note_key, "notes", exact=False):
            found = await self._note_on(str(person_id), note_key)
            if found is not None:
                return found
        return None

    async def log_email(self, email_key: str, record_id: str, email: EmailActivity) -> str:
        """A message of the conversation as a note on the person (Pipedrive's mail log needs
        its own mailbox sync, not an API create): the subject, which way it went and the
        text the policy lets in, once per key, as `log_note` logs the inbound email."""
        way = "Email received" if email.inbound else "Email sent"
        text = f"{way}: {email.subject}" + (f"\n\n{email.text}" if email.text else "")
        return await self.log_note(email_key, record_id, text, email.occurred_at)

    async def find_email(self, email_key: str) -> str | None:
        return await self.find_note(email_key)

    async def associate_note(self, note_id: str, record_id: str) -> None:
        """The note's `person_id` is set by the create itself: nothing to do."""

    # --- merges ----------------------------------------------------------------------------
    follows_notes = True  # survivor_of uses the notes we logged (the activity passes them)

    async def survivor_of(self, record_id: str, external_id: str | None = None,
                          notes: tuple[str, ...] = ()) -> Survivor | None:
        """A person merged away (`PUT /v1/persons/{id}/merge`) is removed, and its read names
        no survivor; the survivor (`merge_with_id`) keeps its own values and takes the merged
        person's where its own are empty, our ID field among them. So: the stored person
        read by ID (one record read; the common case, it answers active, ends here); gone,
        the person now carrying our ID is the survivor. None: still there, or gone with our
        ID on no other person. Then the notes we logged on it (`notes`, newest first): a merge
        moves them to the survivor (`GET /v1/notes/{id}`, a record read, its `person_id`), so
        a survivor that kept another contact's ID of ours is named with that ID; none found
        (the notes gone too): deleted, no survivor."""
        if not record_id.isdigit() or await self._person(record_id) is not None:
            return None
        if external_id is None:
            return None
        found = await self.find_contact(external_id)
        if found is not None and found.record_id != record_id:
            return Survivor(record_id=found.record_id, external_id=external_id)
        key = await self.field_key()
        for note_id in notes:
            if not note_id.isdigit():
                continue
            response = await self._call("GET", f"/v1/notes/{int(note_id)}",
                                        passthrough=(404,))
            note = _data(response) if response.status_code != 404 else None
            person_id = note.get("person_id") if isinstance(note, dict) else None
            if isinstance(person_id, dict):  # Pipedrive may expand it: {"value": id, …}
                person_id = person_id.get("value")
            if not isinstance(person_id, int) or str(person_id) == record_id:
                continue
            person = await self._person(person_id)
            if person is not None:
                held = person.get(key)
                return Survivor(record_id=str(person["id"]),
                                external_id=str(held) if held else None)
        return None

    async def claim_survivor(self, survivor: Survivor, external_id: str) -> bool:
        if survivor.external_id:
            return survivor.external_id == external_id
        key = await self.field_key()
        await self._call("PUT", f"/v1/persons/{int(survivor.record_id)}",
                         json={key: external_id})
        return True

    # --- consent ---------------------------------------------------------------------------
    consent_field = OPT_OUT_FIELD

    async def read_opt_out(self, record_id: str) -> OptOut:
        """The person's `marketing_status`, read by ID: `unsubscribed` is an opt-out."""
        person = await self._person(record_id) if record_id.isdigit() else None
        if person is None:
            raise AdapterError(Classified(Category.PERMANENT, "http_404", None, 404))
        return OptOut(record_id=record_id, field=OPT_OUT_FIELD,
                      opted_out=person.get(OPT_OUT_FIELD) == OPTED_OUT)

    async def write_opt_out(self, email: str, record_id: str | None) -> OptOutWritten:
        """`marketing_status: unsubscribed` on our person, or on every person holding the
        address when we never reached Pipedrive with it. Only that field is sent."""
        if record_id:
            targets = [record_id]
        else:
            persons = await self._persons(await self._search(email, "email"))
            targets = [str(p["id"]) for p in persons if _holds(p, email)]
        for target in targets[:MAX_CANDIDATES]:
            await self._call("PUT", f"/v1/persons/{int(target)}",
                             json={OPT_OUT_FIELD: OPTED_OUT})
        return OptOutWritten(field=OPT_OUT_FIELD, record_ids=tuple(targets[:MAX_CANDIDATES]))

    async def aclose(self) -> None:
        await self._client.aclose()


def _fill_update(person: dict[str, Any], fields: ContactFields,
                 allowed: Collection[str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """`first_name`/`last_name` for a person we did not create, only when it has no name of a
    person's (Pipedrive shows the email as the name of a person saved without one) and the
    policy allows the name; the company is an organization, never written by us."""
    named = person.get("first_name") or person.get("last_name") or (
        person.get("name") and str(person.get("name")).lower() != fields.email.lower())
    fill = fields_to_fill(fields, allowed, () if named else ("name",))
    if "name" not in fill:
        return {}, ()
    first, last = _split_name(fill["name"])
    return {k: v for k, v in (("first_name", first), ("last_name", last)) if v}, ("name",)


def _added(person: dict[str, Any]) -> datetime | None:
    """A person's `add_time` ("YYYY-MM-DD HH:MM:SS", UTC); None where it cannot be read (the
    window is then taken as not reached yet)."""
    try:
        return datetime.strptime(str(person.get("add_time")), "%Y-%m-%d %H:%M:%S").replace(
            tzinfo=UTC)
    except ValueError:
        return None


def _holds(person: dict[str, Any], email: str) -> bool:
    """The person holds the address (any of its emails, compared case-insensitively)."""
    emails = person.get("email")
    values = [e.get("value") for e in emails if isinstance(e, dict)] \
        if isinstance(emails, list) else []
    return email.lower() in {str(v).lower() for v in values if v}


# --- the provider ----------------------------------------------------------------------------
class PipedriveDestination(CrmDestination):
    """A tenant's Pipedrive company (`destinations.crm` with `"provider": "pipedrive"`)."""

    # Pipedrive's API hosts (developers.pipedrive.com): the shared one and company domains.
    documented_hosts: ClassVar[tuple[str, ...]] = ("api.pipedrive.com", "*.pipedrive.com")
    url: str | None = None               # API root (default https://api.pipedrive.com)
    token: SecretRef | None = None       # the API token (Personal preferences → API)
    external_id_field: str | None = None  # our custom person field: its name or its key

    @field_validator("external_id_field")
    @classmethod
    def _field(cls, value: str | None) -> str | None:
        if value is not None and not (_FIELD_KEY.match(value) or _FIELD_LABEL.match(value)):
            raise ValueError("must be a Pipedrive field name or a 40-character field key")
        return value

    def endpoints(self) -> list[tuple[str, str]]:
        return [("url", self.url)] if self.url else []

    @model_validator(mode="after")
    def _complete(self) -> PipedriveDestination:
        if self.token is None:
            raise ValueError("a pipedrive destination needs its token")
        return self


@register
class PipedriveProvider(CrmProvider[PipedriveDestination]):
    name = PipedriveCrm.name
    destination = PipedriveDestination
    sandbox = ("inboxcrm/sandbox/pipedrive.py",)
    conformance = "tests/conformance/test_pipedrive.py"

    def from_settings(self, settings: Settings) -> PipedriveCrm:
        token = secret_value(settings.crm_token)
        if not token:
            raise ConfigurationError("INBOXCRM_CRM_TOKEN is required for the pipedrive provider")
        return PipedriveCrm(settings.crm_url or PIPEDRIVE_API, token,
                            timeout=settings.http_timeout_seconds)

    def from_destination(self, spec: PipedriveDestination, settings: Settings,
                         secrets: Secrets) -> PipedriveCrm:
        assert spec.token is not None  # the destination requires it
        return PipedriveCrm(spec.url or PIPEDRIVE_API, secrets.get(spec.token, "token"),
                            external_id_field=spec.external_id_field
                            or DEFAULT_EXTERNAL_ID_FIELD,
                            timeout=settings.http_timeout_seconds, guard=secrets.guard)
