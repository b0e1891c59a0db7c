"""The adapter interfaces the CRM and send activities program against."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from inboxcrm.adapters.errors import Classified


class AdapterError(Exception):
    """A classified failure of an external call. The message carries no payload."""

    def __init__(self, classified: Classified, request_id: str | None = None) -> None:
        super().__init__(f"{classified.category.value}: {classified.reason}")
        self.classified = classified
        # The provider's ID of the answer that failed (`adapters.http.request_id_of`), if any.
        self.request_id = request_id


# Our fields a record we did not create may be filled with (policy's `updatable_fields`): never
# the email (the record's primary email is the salesperson's), never the owner.
FILLABLE_FIELDS = ("name", "company")


@dataclass(frozen=True)
class ContactFields:
    email: str
    name: str | None = None
    company: str | None = None
    # Which of them an adoption may fill where the existing record holds them empty: the
    # tenant's `updatable_fields` (the CRM step passes them).
    fill: tuple[str, ...] = FILLABLE_FIELDS


def fields_to_fill(fields: ContactFields, allowed: Collection[str],
                   empty: Collection[str]) -> dict[str, str]:
    """What a fill-only write (`CrmClient.fill_contact`) sends, by our field name: the fields
    the tenant's policy lets us update (`allowed`), that we have a value for and that the
    record holds empty (`empty`, as the adapter read it). Anything a person set stays."""
    ours = {"name": fields.name, "company": fields.company}
    return {name: value.strip() for name in FILLABLE_FIELDS
            if name in allowed and name in empty
            and (value := ours[name]) is not None and value.strip()}


@dataclass(frozen=True)
class Filled:
    """A fill-only write on a record we did not create: the record, and which of our fields
    were written onto it (none: it held every allowed field already, nothing was sent)."""

    record_id: str
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class CrmRecord:
    record_id: str
    created: bool | None = None  # None when the destination does not say
    adopted: bool = False        # an existing record with that email was adopted
    # The adopted record now carries our external ID (a lookup by it finds the record).
    marked: bool = False


class MatchCandidates(Exception):  # noqa: N818 - an outcome, not an error
    """Several records in the CRM hold the contact's email and none carries our external ID:
    which one is the person is a person's choice (never ours), and creating another would be
    a duplicate. Nothing was written. `record_ids`: the CRM's IDs of the candidates."""

    def __init__(self, record_ids: tuple[str, ...]) -> None:
        super().__init__(f"{len(record_ids)} existing records match the email")
        self.record_ids = record_ids


@dataclass(frozen=True)
class EmailActivity:
    """One message of the conversation as the CRM's email activity: the inbound email, or
    our follow-up once sent. `text`: what the tenant's policy lets in (`crm_email_text`)."""

    inbound: bool
    subject: str
    text: str
    occurred_at: datetime


@dataclass(frozen=True)
class CrmRecordView:
    """A CRM record as the destination holds it now (the drift check's read)."""

    record_id: str
    external_id: str | None  # our external-ID property on it (None: the record has none)


class Unverifiable(Exception):
    """The destination cannot be asked about what it holds (SMTP): reported, never guessed."""


class CrmClient(Protocol):
    name: str

    async def upsert_contact(self, external_id: str, fields: ContactFields) -> CrmRecord:
        """Create or update the contact keyed by our unique external ID. Safe to repeat.
        Match before create: a record the CRM already holds for the email (created outside
        inboxcrm) is adopted (`adopted=True`); several raise `MatchCandidates`."""
        ...

    async def find_contact(self, external_id: str) -> CrmRecord | None:
        """Look the contact up by external ID; read-after-write consistent where possible."""
        ...

    async def fill_contact(self, record_id: str, fields: ContactFields,
                           allowed: Collection[str]) -> Filled | None:
        """A later write to a record we did not create (adopted, or a merge's survivor): one
        read of it by the CRM's own ID, then only `fields_to_fill` (allowed by policy, empty
        on the record) written; never the email, the owner, our external ID or a field a
        person set. None: the record no longer answers (deleted), nothing was written."""
        ...

    async def log_note(self, note_key: str, record_id: str, text: str,
                       occurred_at: datetime) -> str:
        """Log the inbound email on the contact (dated `occurred_at`, the message's date),
        keyed by `note_key`, and associate it with the record. Safe to repeat."""
        ...

    async def find_note(self, note_key: str) -> str | None:
        """The note logged under `note_key`, if any (reconciliation)."""
        ...

    async def read_contact(self, record_id: str) -> CrmRecordView | None:
        """Read a record by the CRM's own ID (drift check); None when it no longer exists."""
        ...

    async def log_email(self, email_key: str, record_id: str, email: EmailActivity) -> str:
        """Log one message of the conversation as the CRM's email activity on the record,
        keyed by `email_key` (unique in the CRM: a repeat never logs it twice)."""
        ...

    async def find_email(self, email_key: str) -> str | None:
        """The email activity logged under `email_key`, if any (reconciliation)."""
        ...

    async def associate_note(self, note_id: str, record_id: str) -> None:
        """Make sure the note is associated with the record (reconciliation re-asserts it
        after finding the note). Safe to repeat."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class OptOut:
    """A CRM record's email opt-out as the CRM holds it now (`field` names the CRM's own
    field: HubSpot `hs_email_optout`, Salesforce `HasOptedOutOfEmail`)."""

    record_id: str
    field: str
    opted_out: bool


@dataclass(frozen=True)
class OptOutWritten:
    """What writing an opt-out changed: the CRM field and the records it was set on (none
    when the CRM holds no record for the address)."""

    field: str
    record_ids: tuple[str, ...]


@runtime_checkable
class CrmConsent(Protocol):
    """Optional: a CRM whose records carry an email opt-out (docs/consent.md). The send reads
    it right before the call; inboxcrm's own suppressions are written to it as an operation of
    their own. A CRM client without it falls back to inboxcrm's suppression list alone."""

    consent_field: str

    async def read_opt_out(self, record_id: str) -> OptOut:
        """The record's opt-out, read from the CRM now (a record read, no search index)."""
        ...

    async def write_opt_out(self, email: str, record_id: str | None) -> OptOutWritten:
        """Set the opt-out for the address (on `record_id` when we know it). Safe to repeat:
        it only ever sets the field to opted out."""
        ...


@dataclass(frozen=True)
class Survivor:
    """The record a merged record now stands for (docs/architecture.md §5, "Changes of address
    and merges"). `external_id`: our external ID on it (None: it carries none)."""

    record_id: str
    external_id: str | None


@runtime_checkable
class CreatesByLookup(Protocol):
    """A CRM without upsert by our external ID (Pipedrive): `upsert_contact` looks up, then
    creates, so two of our writers for one contact (two emails from one person, in flight
    at once) must not run it together: the step holds the contact's create lock around it
    (docs/architecture.md §5, Pipedrive). HubSpot's and Salesforce's upserts are keyed by
    our unique ID and need none."""

    creates_by_lookup: bool


@runtime_checkable
class CrmMerges(Protocol):
    """Optional: a CRM whose merges can be told from a read by the record's own ID (HubSpot:
    the old ID answers the survivor; Salesforce: the deleted record's `MasterRecordId`;
    Pipedrive: the old ID is gone and our external ID moved to the survivor).
    A contact whose stored record was merged is followed to the survivor, never re-created."""

    # True where `survivor_of` needs the CRM IDs of the notes we logged (Pipedrive: the
    # merge moves them to the survivor); the activity reads them from the store only then.
    follows_notes: bool

    async def survivor_of(self, record_id: str, external_id: str | None = None,
                          notes: tuple[str, ...] = ()) -> Survivor | None:
        """The survivor `record_id` was merged into; None when it was not merged (it still
        answers as itself, or it is gone without a survivor). A record read, no search, where
        the CRM's read of the old ID names the survivor (HubSpot, Salesforce); Pipedrive's
        does not, and its survivor is the person our `external_id` moved to (a lookup by it,
        only once the old ID no longer answers), else the person our logged `notes` (their
        CRM IDs, newest first) moved to: a survivor that kept another contact's ID of ours.
        HubSpot and Salesforce ignore `notes`."""
        ...

    async def claim_survivor(self, survivor: Survivor, external_id: str) -> bool:
        """Write our external ID onto the survivor when it carries none (that field only:
        the owner and what a person set stay). False when it carries another ID of ours (a
        record of another contact of ours): then nothing is written. Safe to repeat."""
        ...


@dataclass(frozen=True)
class GuaranteeCheck:
    """One field a CRM's no-duplicates guarantee rests on, as the CRM defines it now
    (`inboxcrm crm check`, and the worker at start). `problem`: None when the field exists,
    is unique and is an external ID; else one line naming the field and what to do (field
    names only, never a record)."""

    provider: str
    object: str   # the CRM's object: Salesforce `Contact`, `Lead`, `Task`; HubSpot `contacts`
    field: str
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


@runtime_checkable
class CrmGuarantee(Protocol):
    """Optional: a CRM whose field definitions can be read. An upsert keyed by a field that is
    not unique (or not an external ID) can create a second record or match several, so a
    tenant whose CRM fails this check is not taken live (docs/architecture.md §5)."""

    async def check_external_id(self) -> tuple[GuaranteeCheck, ...]:
        """Read the definitions of the fields our writes are keyed by (a metadata read, no
        record touched)."""
        ...


@dataclass(frozen=True)
class OutgoingEmail:
    to: str
    subject: str
    text: str
    headers: dict[str, str] = field(default_factory=dict)
    # The tenant's From and Reply-To (docs/architecture.md §5); None: the adapter's own From
    # (INBOXCRM_MAIL_FROM) and no Reply-To.
    sender: str | None = None
    reply_to: str | None = None
    html: str | None = None
    # `time.monotonic()` by which the delivery must be over (the end of the send lease): an
    # adapter that cannot finish by then must not start handing the message over.
    deliver_by: float | None = None


@dataclass(frozen=True)
class SentEmail:
    message_id: str


@dataclass(frozen=True)
class SentRecord:
    """An email as the provider holds it now (the drift check's read)."""

    message_id: str
    idempotency_key: str | None  # where the provider reports it (Resend does not)


class MailClient(Protocol):
    name: str
    # False where an unknown outcome cannot be reconciled (no idempotency key): SMTP.
    reconcilable: bool
    # How long the provider keeps an idempotency key after its first request (Resend: 24 h).
    # Inside it, repeating the identical request with the same key IS the reconciliation (the
    # provider answers the original ID and sends nothing); past it a repeat would send again.
    # None where there is no key.
    key_window_seconds: float | None

    async def send(self, idempotency_key: str, message: OutgoingEmail) -> SentEmail: ...

    async def read_sent(self, message_id: str) -> SentRecord | None:
        """Read an email by the provider's message ID (drift check); None when the provider
        does not know it. Raises `Unverifiable` where the provider cannot be asked."""
        ...

    def where_to_look(self, idempotency_key: str) -> str:
        """The exact request (or place) a person checks at the provider to learn whether the
        email sent with this key exists: the ambiguous card's lookup path. No I/O, no
        personal data (the card shows the recipient itself)."""
        ...

    async def aclose(self) -> None: ...
