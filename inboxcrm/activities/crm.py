"""upsert_contact_in_crm: one CRM side effect, keyed by the integration contact ID.

The CRM is called with our contact ID as its unique external ID, so a repeated request
updates the same record. After an uncertain attempt the record is looked up by that ID
first (read-after-write consistent, not the lagging search index).

The conversation (docs/architecture.md §5, "The conversation in the CRM"): the inbound
email as the CRM's email activity (`…:crm-email`) and our follow-up once sent
(`…:crm-sent`), each an operation of its own, keyed in the CRM by a unique ID derived from
its operation key; the text each carries is what the tenant's `crm_email_text` allows.

Match before create (the adapter's `upsert_contact`): a record the CRM already held for the
email is adopted, audited (`crm_record_adopted`) and counted
(`inboxcrm_crm_adoptions_total{provider}`); several such records send the item to review
(`crm_candidates`, the CRM's record IDs in the audit and on the card) with nothing written.

A record we did not create is never written over (`contacts.crm_origin`, migration 080,
stored with the record ID): later upserts of an adopted record, a merge's survivor or one
whose origin is not known (reconciled) go through `CrmClient.fill_contact` by the record's
own ID: one read, then only the fields the tenant's `updatable_fields` allows and the record
holds empty; never the email or the owner. Records we created are upserted by our ID as
before, with no read more.

Merges (docs/architecture.md §5, "Changes of address and merges"): a contact whose stored
record was merged in the CRM is followed to the survivor before the upsert (`CrmMerges`),
and on a note, email or association refused for good on the stored record; audited
(`crm_record_merged`) and counted (`inboxcrm_crm_merges_followed_total{provider}`). A
survivor that already carries another contact's external ID of ours (both records were
ours: a salesperson merged two of our contacts) is never followed silently: the contact
would point at a record holding another's ID. The upsert goes to review
(`crm_merged_into_other_contact`, the survivor on the card, the other contact named in the
audit) with nothing written or stored; a note, email or association refused on the merged
record is blocked with the same reason. A person decides: the records split again in the
CRM, then retry; or reject (`inboxcrm contact link` still refuses two contacts that both
have records of their own, so it cannot join them yet).
"""

from __future__ import annotations

import email.parser
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import asyncpg
from temporalio import activity

from inboxcrm.activities.counters import count
from inboxcrm.activities.failures import missing_row
from inboxcrm.activities.outbox import (
    MAX_PARK_SECONDS,
    Attempt,
    OutboxRunner,
    Performed,
    Recorded,
)
from inboxcrm.activities.send import compose_intent
from inboxcrm.adapters.base import (
    AdapterError,
    ContactFields,
    CreatesByLookup,
    CrmClient,
    CrmMerges,
    CrmRecord,
    EmailActivity,
    MatchCandidates,
)
from inboxcrm.adapters.errors import Category, Classified
from inboxcrm.adapters.factory import ConfigurationError, Destinations
from inboxcrm.domain.extraction.minimise import date_written, minimise
from inboxcrm.domain.policy import get_policy
from inboxcrm.platform import atrest
from inboxcrm.platform.config import Settings, get_settings
from inboxcrm.schemas.models import Action, ItemState, OperationInput, OperationResult
from inboxcrm.store import audit, contacts, intents, ledger

CANDIDATES_REASON = "crm_candidates"
MERGED_INTO_OTHER_REASON = "crm_merged_into_other_contact"


class MergedIntoOther(Exception):  # noqa: N818 - an outcome, not an error
    """The contact's stored record was merged into one carrying another contact's external
    ID of ours: following it would re-point this contact at another's record."""

    def __init__(self, record_id: str, survivor_id: str, other_contact_id: str) -> None:
        super().__init__("the CRM merged the record into one carrying another contact's ID")
        self.record_id = record_id
        self.survivor_id = survivor_id
        self.other_contact_id = other_contact_id

# A Date header further ahead of the receipt than clock skew explains is not believed.
MAX_DATE_AHEAD = timedelta(hours=1)


class CrmActivities:
    def __init__(self, pool: asyncpg.Pool, crm: CrmClient | Destinations,
                 max_retry_after: float, max_park: float = MAX_PARK_SECONDS,
                 settings: Settings | None = None) -> None:
        """`crm`: each tenant's account (`Destinations`), or one client for every tenant.
        `settings`: the worker's (the follow-up's log is composed as the send composed it),
        else the process's."""
        self._pool = pool
        self._settings = settings or get_settings()
        self._destinations = crm if isinstance(crm, Destinations) else Destinations.fixed(crm)
        self._runner = OutboxRunner(pool, action=Action.CRM_UPSERT.value, pause_scope="crm",
                                    max_retry_after=max_retry_after, max_park=max_park,
                                    also_record=ledger.AlsoRecord.CRM_RECORD_ON_CONTACT)
        self._note_runner = OutboxRunner(pool, action=Action.CRM_NOTE.value, pause_scope="crm",
                                         max_retry_after=max_retry_after,
                                         max_park=max_park)
        self._email_runner = OutboxRunner(pool, action=Action.CRM_EMAIL.value,
                                          pause_scope="crm", max_retry_after=max_retry_after,
                                          max_park=max_park)
        self._sent_runner = OutboxRunner(pool, action=Action.CRM_SENT.value, pause_scope="crm",
                                         max_retry_after=max_retry_after, max_park=max_park)

    @activity.defn(name="log_inbound_email_in_crm")
    async def log_inbound_email_in_crm(self, op: OperationInput) -> OperationResult:
        """The inbound email as the CRM's email activity on the contact's record."""
        return await self._email_runner.run(
            op, reconcile=self._find_email, perform=self._log_inbound,
            record_success=self._record_email, running_state=ItemState.CRM_PENDING)

    @activity.defn(name="log_followup_in_crm")
    async def log_followup_in_crm(self, op: OperationInput) -> OperationResult:
        """Our follow-up, once sent, as the CRM's email activity on the same record."""
        return await self._sent_runner.run(
            op, reconcile=self._find_email, perform=self._log_sent,
            record_success=self._record_email, running_state=ItemState.SEND_PENDING)

    async def _find_email(self, attempt: Attempt) -> str | None:
        """Reconcile: the activity by its unique key (the association is part of the
        create, so finding it is enough)."""
        return await self._crm(attempt.op.item.tenant).find_email(note_key(attempt.op.op_key))

    async def _log_inbound(self, attempt: Attempt) -> str:
        item = attempt.op.item
        async with self._pool.acquire() as conn:
            row = await contacts.load_email_context(conn, event_id=item.event_id)
        if row is None or row["crm_record_id"] is None:
            raise missing_row("crm_record")
        subject, text = "", ""
        head = atrest.open_head(row["head"], tenant=str(row["tenant"]), event_id=item.event_id)
        if head is not None:  # purged: the subject and text are gone
            # Bounded (the first 64 KiB), as the note's head was read before migration 041.
            message = minimise(head)
            subject, text = message.subject, message.body[:message.own_text_chars]
        email = EmailActivity(
            inbound=True, subject=subject, text=get_policy(item.tenant).crm_text(text),
            occurred_at=note_time(row["written_at"], None, row["received_at"]))
        crm = self._crm(item.tenant)
        return await self._on_record(attempt, row, lambda record_id: crm.log_email(
            note_key(attempt.op.op_key), record_id, email))

    async def _log_sent(self, attempt: Attempt) -> str:
        item = attempt.op.item
        intent_id = attempt.claim.external_ref
        if intent_id is None:
            raise missing_row("intent_reference")
        async with self._pool.acquire() as conn:
            context = await contacts.load_note_context(conn, event_id=item.event_id)
            async with conn.transaction():
                row = await intents.claim_intent(conn, intent_id=intent_id,
                                                 event_id=item.event_id)
                if row is None:
                    raise missing_row("followup_intent")
                followup = await compose_intent(conn, row, self._settings, for_log=True)
        if context is None or context["crm_record_id"] is None:
            raise missing_row("crm_record")
        email = EmailActivity(
            inbound=False, subject=followup.subject,
            text=get_policy(item.tenant).crm_text(followup.text),
            occurred_at=row["sent_at"] or context["received_at"])
        crm = self._crm(item.tenant)
        return await self._on_record(attempt, context, lambda record_id: crm.log_email(
            note_key(attempt.op.op_key), record_id, email))

    def _record_email(self, attempt: Attempt, email_id: str, reconciled: bool) -> Recorded:
        return Recorded(
            actor="crm", action="crm_email_logged",
            detail={"op_key": attempt.op.op_key, "crm": self._crm(attempt.op.item.tenant).name,
                    "email_activity_id": email_id, "attempt": attempt.claim.attempts,
                    "reconciled": reconciled},
        )

    @activity.defn(name="log_email_on_contact")
    async def log_email_on_contact(self, op: OperationInput) -> OperationResult:
        """The inbound email as a note on the CRM contact: a side effect of its own, with its
        own key (`…:crm-note`), so retrying one never repeats the other."""
        return await self._note_runner.run(
            op, reconcile=self._find_note, perform=self._log_note,
            record_success=self._record_note, running_state=ItemState.CRM_PENDING,
        )

    def _crm(self, tenant: str) -> CrmClient:
        """The tenant's CRM account; one that cannot be built blocks the item (never
        another account)."""
        try:
            return self._destinations.crm(tenant)
        except ConfigurationError as exc:
            activity.logger.error("CRM destination unusable: %s", exc)
            raise AdapterError(Classified(Category.PERMANENT, "destination_config")) from None

    async def _find_note(self, attempt: Attempt) -> str | None:
        """Reconcile: the note by its unique property; when found, re-assert its association
        (the attempt may have ended between the upsert and the association)."""
        crm = self._crm(attempt.op.item.tenant)
        note_id = await crm.find_note(note_key(attempt.op.op_key))
        if note_id is not None:
            row = await self._note_context(attempt)

            async def associate(record_id: str) -> str:
                await crm.associate_note(note_id, record_id)
                return record_id

            await self._on_record(attempt, row, associate)
        return note_id

    async def _note_context(self, attempt: Attempt) -> asyncpg.Record:
        async with self._pool.acquire() as conn:
            row = await contacts.load_note_context(conn, event_id=attempt.op.item.event_id)
        if row is None or row["crm_record_id"] is None:
            raise missing_row("crm_record")
        return row

    async def _log_note(self, attempt: Attempt) -> str:
        row = await self._note_context(attempt)
        text = (f"Inbound email received via {row['source']} at "
                f"{row['received_at'].isoformat(timespec='seconds')} (delivery "
                f"{row['delivery_id']}); intent: {row['intent'] or 'unknown'}; handled by "
                "inboxcrm.")
        crm = self._crm(attempt.op.item.tenant)
        head = atrest.open_head(row["head"], tenant=str(row["tenant"]),
                                event_id=attempt.op.item.event_id)
        when = note_time(row["written_at"], head, row["received_at"])
        return await self._on_record(attempt, row, lambda record_id: crm.log_note(
            note_key(attempt.op.op_key), record_id, text, when))

    def _record_note(self, attempt: Attempt, note_id: str, reconciled: bool) -> Recorded:
        return Recorded(
            actor="crm", action="crm_note_logged",
            detail={"op_key": attempt.op.op_key, "crm": self._crm(attempt.op.item.tenant).name,
                    "note_id": note_id,
                    "attempt": attempt.claim.attempts, "reconciled": reconciled},
        )

    @activity.defn(name="upsert_contact_in_crm")
    async def upsert_contact_in_crm(self, op: OperationInput) -> OperationResult:
        return await self._runner.run(
            op, reconcile=self._find, perform=self._upsert, record_success=self._record,
            running_state=ItemState.CRM_PENDING,
        )

    async def _find(self, attempt: Attempt) -> str | None:
        record = await self._crm(attempt.op.item.tenant).find_contact(_contact_id(attempt))
        return record.record_id if record else None

    async def _upsert(self, attempt: Attempt) -> Performed | OperationResult:
        async with self._pool.acquire() as conn:
            row = await contacts.load_contact(conn, contact_id=_contact_id(attempt))
        if row is None:
            raise missing_row("contact")
        crm = self._crm(attempt.op.item.tenant)
        contact_id = str(row["contact_id"])
        # What an adoption, or a later write to a record we did not create, may fill.
        allowed = tuple(get_policy(attempt.op.item.tenant).updatable_fields)
        fields = ContactFields(email=row["email"], name=row["name"], company=row["company"],
                               fill=allowed)
        if row["crm_record_id"]:
            try:
                followed = await self._follow(attempt, crm, contact_id, row["crm_record_id"])
            except MergedIntoOther as merged:
                return await self._to_review(
                    attempt, crm.name, (merged.survivor_id,), reason=MERGED_INTO_OTHER_REASON,
                    detail={"old": merged.record_id,
                            "other_contact_id": merged.other_contact_id})
            if followed is not None:
                # The survivor is the record now, as a salesperson left it: like an adopted
                # record it gets our external ID only (where it carries none), never our
                # fields over theirs; and one carrying another contact's ID of ours is not
                # upserted by ours at all (that would create a second record).
                return _written(followed[0], contacts.CrmOrigin.MERGED, ())
            if row["crm_origin"] != contacts.CrmOrigin.CREATED:
                # Not ours (adopted, a merge's survivor, or not known): filled where empty as
                # policy allows, by the record's own ID (one read), never written over.
                filled = await crm.fill_contact(row["crm_record_id"], fields, allowed)
                if filled is not None:
                    origin = row["crm_origin"]
                    return _written(filled.record_id,
                                    contacts.CrmOrigin(origin) if origin else None,
                                    filled.fields)
                # The record is gone (deleted, no survivor): matched again as a new one.
        try:
            record = await self._match_or_create(crm, contact_id, fields)
        except MatchCandidates as many:
            return await self._to_review(attempt, crm.name, many.record_ids)
        if record.adopted:
            await self._adopted(attempt, crm.name, record)
        return _written(record.record_id, contacts.CrmOrigin.ADOPTED if record.adopted
                        else contacts.CrmOrigin.CREATED, None)

    async def _match_or_create(self, crm: CrmClient, contact_id: str,
                               fields: ContactFields) -> CrmRecord:
        """The upsert; where the CRM's is a lookup then a create, under the contact's create
        lock, so a second item of the contact in flight at once waits and then finds the
        first one's record instead of creating another (a connection is held meanwhile)."""
        if not isinstance(crm, CreatesByLookup) or not crm.creates_by_lookup:
            return await crm.upsert_contact(contact_id, fields)
        async with self._pool.acquire() as conn, conn.transaction():
            await contacts.lock_crm_create(conn, contact_id=contact_id)
            return await crm.upsert_contact(contact_id, fields)

    async def _follow(self, attempt: Attempt, crm: CrmClient, contact_id: str,
                      record_id: str) -> tuple[str, bool] | None:
        """The contact's stored record was merged in the CRM: follow it to the survivor (our
        external ID written onto it where it carries none), store the survivor as the
        contact's record, audit (`crm_record_merged`) and count. (survivor, carries our ID),
        or None when the record was not merged (or the CRM cannot tell)."""
        if not isinstance(crm, CrmMerges):
            return None
        notes: tuple[str, ...] = ()
        if crm.follows_notes:  # Pipedrive: where our notes moved
            notes = await contacts.logged_note_ids(self._pool, contact_id=contact_id)
        survivor = await crm.survivor_of(record_id, contact_id, notes)
        if survivor is None:
            return None
        if survivor.external_id and survivor.external_id != contact_id:
            count("inboxcrm_crm_merge_conflicts", "CRM merges into a record carrying another "
                  "contact's ID of ours, sent to a person", provider=crm.name)
            raise MergedIntoOther(record_id, survivor.record_id, survivor.external_id)
        claimed = await crm.claim_survivor(survivor, contact_id)
        count("inboxcrm_crm_merges_followed", "Merged CRM records followed to the survivor",
              provider=crm.name)
        item = attempt.op.item
        async with self._pool.acquire() as conn, conn.transaction():
            await contacts.record_survivor(conn, contact_id=contact_id,
                                           crm_record_id=survivor.record_id)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                contact_id=contact_id, actor="crm", action="crm_record_merged",
                detail={"old": record_id, "survivor": survivor.record_id, "crm": crm.name,
                        "op_key": attempt.op.op_key, "external_id_written": claimed,
                        "attempt": attempt.claim.attempts})
        return survivor.record_id, claimed

    async def _on_record(self, attempt: Attempt, row: asyncpg.Record,
                         call: Callable[[str], Awaitable[str]]) -> str:
        """Write to the contact's record; refused for good (the record was merged away since
        the upsert stored it: Salesforce's deleted record), follow the merge and write to the
        survivor once. No extra read while the record answers."""
        record_id: str = row["crm_record_id"]
        try:
            return await call(record_id)
        except AdapterError as exc:
            if exc.classified.category is not Category.PERMANENT:
                raise
            crm = self._crm(attempt.op.item.tenant)
            try:
                followed = await self._follow(attempt, crm, str(row["contact_id"]), record_id)
            except MergedIntoOther:
                raise AdapterError(Classified(Category.PERMANENT,
                                              MERGED_INTO_OTHER_REASON)) from None
            if followed is None:
                raise
        return await call(followed[0])

    async def _adopted(self, attempt: Attempt, provider: str, record: CrmRecord) -> None:
        """An existing record (created outside inboxcrm) is now ours: audited, counted."""
        count("inboxcrm_crm_adoptions", "Existing CRM records adopted by email",
              provider=provider)
        item = attempt.op.item
        async with self._pool.acquire() as conn:
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                contact_id=_contact_id(attempt), actor="crm", action="crm_record_adopted",
                detail={"op_key": attempt.op.op_key, "crm": provider,
                        "crm_record_id": record.record_id, "external_id_written": record.marked,
                        "attempt": attempt.claim.attempts})

    async def _to_review(self, attempt: Attempt, provider: str, record_ids: tuple[str, ...],
                         reason: str = CANDIDATES_REASON,
                         detail: dict[str, str] | None = None) -> OperationResult:
        """Several existing records match (or the stored record was merged into another
        contact's, `MERGED_INTO_OTHER_REASON`): nothing was written, so the attempt is given
        back as refused (no key window) and a person picks; the workflow waits in review and
        tries again after the decision (e.g. once the records were merged in the CRM)."""
        op, claim, item = attempt.op, attempt.claim, attempt.op.item
        count("inboxcrm_crm_match_reviews", "CRM upserts sent to review: several matches",
              provider=provider)
        async with self._pool.acquire() as conn, conn.transaction():
            owned = await ledger.record_failure(
                conn, op.op_key, claim.attempts, "waiting", Category.PERMANENT.value,
                reason, refused=True, window_before=claim.key_window_from)
            if owned:
                await audit.append(
                    conn, tenant=item.tenant, event_id=item.event_id,
                    workflow_id=item.workflow_id, contact_id=_contact_id(attempt), actor="crm",
                    action="crm_match_needs_review",
                    detail={"op_key": op.op_key, "crm": provider, "reason": reason,
                            "candidates": list(record_ids), "attempt": claim.attempts,
                            **(detail or {})})
        return OperationResult(status="review", reason=reason)

    def _record(self, attempt: Attempt, record_id: str, reconciled: bool) -> Recorded:
        """The record ID goes onto the contact (`AlsoRecord.CRM_RECORD_ON_CONTACT`) with this
        entry, and with it where the record came from (`crm_origin`: None when reconciled,
        which cannot tell our create from an adoption; the attempt's own write says it,
        `_written`). `fields_filled`: our field names a fill-only write put on a record we
        did not create (None: a normal upsert)."""
        return Recorded(
            actor="crm", action="crm_upserted", contact_id=_contact_id(attempt),
            detail={"op_key": attempt.op.op_key, "crm": self._crm(attempt.op.item.tenant).name,
                    "crm_record_id": record_id, "attempt": attempt.claim.attempts,
                    "reconciled": reconciled, "crm_origin": None, "fields_filled": None},
        )


def _written(record_id: str, origin: contacts.CrmOrigin | None,
             filled: tuple[str, ...] | None) -> Performed:
    """What an upsert attempt did, handed to its success entry by the runner: the record's
    origin and, for a record we did not create, the fields filled (None: a normal
    upsert)."""
    return Performed(record_id, {"crm_origin": origin.value if origin else None,
                                 "fields_filled": None if filled is None else list(filled)})


def _contact_id(attempt: Attempt) -> str:
    ref = attempt.claim.external_ref
    if ref is None:
        raise missing_row("contact_reference")
    return ref


def note_time(written_at: datetime | None, head: bytes | None,
              received_at: datetime) -> datetime:
    """When the email was written: its Date header as extraction stored it (or, for an item
    extracted before migration 041, as read from the `head` of the message), else (missing,
    unparsable, without a time zone, purged, or implausibly far ahead) when we received it."""
    if head:
        written_at = date_written(email.parser.BytesHeaderParser().parsebytes(head).get("Date"))
    if written_at is not None and written_at <= received_at + MAX_DATE_AHEAD:
        return written_at
    return received_at


def note_key(op_key: str) -> str:
    """The note's unique external ID: derived from the operation key (so every retry and
    replay reuses it) but opaque, URL-safe and free of any address."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"inboxcrm:{op_key}"))
