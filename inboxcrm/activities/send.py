"""submit_followup_email: one follow-up per intent, with the intent's UUID as the provider
idempotency key.

Eligibility is decided *now*, immediately before submitting, not at extraction time: a
suppression, a cancelled intent or an inactive contact stops the send even if the workflow
was already waiting (for example on a paused send) when the opt-out arrived.

The words are the tenant's template at the version the plan stored (`template_versions`),
in the language the inbound message asks for; From, Reply-To and the mail account are the
tenant's (`inboxcrm.domain.followup`, `inboxcrm.adapters.factory.Destinations`). A
follow-up that cannot carry its opt-out link and postal address is not sent: the operation
is blocked with the reason (`unsubscribe_secret_missing`, …), docs/architecture.md §5.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from inboxcrm.activities.consent import INBOXCRM_ONLY, ConsentView, CrmOptOutCheck
from inboxcrm.activities.failures import missing_row
from inboxcrm.activities.outbox import (
    MAX_PARK_SECONDS,
    Attempt,
    Deferred,
    Fenced,
    OutboxRunner,
    Recorded,
)
from inboxcrm.adapters.base import AdapterError, MailClient, OutgoingEmail
from inboxcrm.adapters.errors import Category, Classified, ErrorType
from inboxcrm.adapters.factory import ConfigurationError, Destinations
from inboxcrm.domain import drafts
from inboxcrm.domain.followup import (
    UNCONFIRMED_THEN,
    Followup,
    FollowupRefused,
    Thread,
    compose,
    draft_sha256,
    followup_message_id,
)
from inboxcrm.domain.policy import PolicyError, TenantPolicy, UnknownTenant, get_policy
from inboxcrm.domain.templates import (
    Template,
    TemplateRefused,
    from_sources,
    reply_languages,
)
from inboxcrm.platform import atrest
from inboxcrm.platform.config import Settings, get_settings
from inboxcrm.schemas.models import (
    Action,
    ItemState,
    OperationInput,
    OperationResult,
    is_again_key,
)
from inboxcrm.store import audit, intents, ledger
from inboxcrm.store import consent as consent_store
from inboxcrm.store import templates as template_store

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# Fallback when the activity has no start-to-close timeout (it always has one here).
LEASE_SECONDS = 30.0
# Left of the step after the lease ends: recording the result before the step times out.
RECORD_MARGIN_SECONDS = 3.0
# Less lease than this left in the step: do not start (the next attempt will have a whole
# step).
MIN_LEASE_SECONDS = 2.0


class SendActivities:
    def __init__(self, pool: asyncpg.Pool, mail: MailClient | Destinations,
                 max_retry_after: float, settings: Settings | None = None,
                 max_park: float = MAX_PARK_SECONDS) -> None:
        """`mail`: each tenant's account (`Destinations`), or one client for every tenant."""
        self._pool = pool
        self._destinations = (mail if isinstance(mail, Destinations)
                              else Destinations.fixed(mail=mail))
        self._settings = settings or get_settings()
        self._runner = OutboxRunner(pool, action=Action.SEND.value, pause_scope="send",
                                    max_retry_after=max_retry_after, max_park=max_park,
                                    also_record=ledger.AlsoRecord.INTENT_SENT)
        # Attempts that repeat an unconfirmed one: their lease is kept on any failure.
        self._uncertain: set[str] = set()
        self._crm_opt_out = CrmOptOutCheck()

    @activity.defn(name="submit_followup_email")
    async def submit_followup_email(self, op: OperationInput) -> OperationResult:
        try:
            mail = self._destinations.mail(op.item.tenant)
        except ConfigurationError as exc:
            # The tenant's mail account cannot be built (a secret reference resolves to
            # nothing): never another account; blocked until the configuration is fixed.
            activity.logger.error("mail destination unusable: %s", exc)
            raise ApplicationError("permanent: destination_config",
                                   type=ErrorType.PERMANENT.value, non_retryable=True) from None

        async def perform(attempt: Attempt) -> str | OperationResult:
            return await self._submit(attempt, mail)

        try:
            return await self._runner.run(
                op, reconcile=self._by_repeating if mail.reconcilable else None,
                perform=perform, record_success=lambda a, m, r: self._record(a, m, r, mail),
                running_state=ItemState.SEND_PENDING, on_failure=self._release_lease,
                key_window_seconds=mail.key_window_seconds,
            )
        except ApplicationError as exc:
            if exc.type == ErrorType.AMBIGUOUS.value:
                try:
                    await self._record_lookup(op, mail)
                except (OSError, asyncpg.PostgresError) as lost:  # the hold itself stands
                    activity.logger.warning("lookup path not recorded (%s)",
                                            type(lost).__name__)
            raise

    async def _record_lookup(self, op: OperationInput, mail: MailClient) -> None:
        """Held ambiguous: where a person checks at the provider whether the email exists
        (the ambiguous card's lookup path), from the adapter that sent it."""
        item = op.item
        async with self._pool.acquire() as conn:
            row = await ledger.get(conn, op.op_key)
            key = row["external_ref"] if row is not None else None
            if key is None:
                return
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=Action.SEND.value, action="operation_lookup",
                detail={"op_key": op.op_key, "provider": mail.name,
                        "lookup": mail.where_to_look(str(key)),
                        "key_window_seconds": mail.key_window_seconds})

    async def _release_lease(self, conn: Conn, attempt: Attempt, failure: Classified) -> None:
        """A request that did not take effect frees the intent for the next attempt at once.
        After an *unknown* outcome, or in an attempt that repeated an unconfirmed one, the
        lease stays until it expires: the email may exist, and an opt-out must not be
        recorded as if it came first. Only the lease's own holder releases it."""
        name = _lease_owner(attempt)
        uncertain = name in self._uncertain
        self._uncertain.discard(name)
        if failure.category is not Category.UNKNOWN and not uncertain:
            await intents.release_lease(conn, intent_id=_intent_id(attempt), lease_owner=name)

    async def _by_repeating(self, attempt: Attempt) -> str | None:
        """The provider cannot be searched by key; inside the key's window (checked by the
        runner) the identical request with the same key answers the original email's ID and
        sends nothing. So: nothing to look up, submit again (`_submit` lets the repeat take
        over the unconfirmed attempt's lease)."""
        return None

    async def _submit(self, attempt: Attempt, mail: MailClient) -> str | OperationResult:
        intent_id = _intent_id(attempt)
        item = attempt.op.item
        attempt_name = _lease_owner(attempt)
        # Taken before the transaction whose now() starts the lease, so the delivery's
        # deadline is never later than the lease's end.
        lease = _lease_seconds()
        deliver_by = time.monotonic() + lease
        if lease < MIN_LEASE_SECONDS:
            raise Deferred("step_time_exhausted", 0.5)
        # The CRM's own opt-out, read now, right before the eligibility check and the call
        # (docs/consent.md); a read that fails stops this attempt, never assumes consent.
        consent = await self._crm_consent(item.tenant, intent_id)
        held: str | None = None
        async with self._pool.acquire() as conn, conn.transaction():
            await intents.lock_contact_of_intent(conn, intent_id=intent_id)
            row = await intents.claim_intent(conn, intent_id=intent_id, event_id=item.event_id)
            if row is None:
                raise missing_row("followup_intent")
            if row["status"] == "sent":
                # Already sent (by an overlapping attempt, or resolved by a person): never
                # submit again; the provider's message ID is the result.
                return str(row["provider_message_id"])
            owner = str(row["lease_owner"] or "")
            # An earlier attempt of this operation took the lease and never gave it back: its
            # outcome is unknown (a failure that did not take effect releases the lease), so
            # this attempt repeats it with the same key, as a reconciliation.
            uncertain = (row["status"] == "sending" and owner != attempt_name
                         and owner.rpartition("#")[0] == attempt.op.op_key)
            record = _consent_record(row)
            refusal = _ineligible(row, record["purpose"], consent)
            consent_detail = {**record, **consent.detail(),
                              "suppression_scope": row["suppression_scope"]}
            if refusal is not None:
                await audit.append(
                    conn, tenant=item.tenant, event_id=item.event_id,
                    workflow_id=item.workflow_id, actor="send", action="eligibility_checked",
                    detail={"intent_id": intent_id, "eligible": False, "reason": refusal,
                            "previous_attempt_unconfirmed": uncertain,
                            "consent": consent_detail,
                            # The CRM field that stopped it, by name (docs/consent.md).
                            "crm_field": consent.field if refusal == CRM_OPT_OUT else None},
                )
                if uncertain:
                    # Repeating could send to someone who may no longer be written to, and
                    # nothing else can confirm the earlier attempt: held for a person.
                    held = f"{UNCONFIRMED_THEN}{refusal}"
                    if not await ledger.record_failure(conn, attempt.op.op_key,
                                                       attempt.claim.attempts, "ambiguous",
                                                       "unknown", held):
                        raise Fenced()
                else:
                    if row["status"] != "cancelled":
                        await intents.cancel_intent(conn, intent_id=intent_id,
                                                    cancel_reason=refusal)
                    if not await ledger.record_failure(conn, attempt.op.op_key,
                                                       attempt.claim.attempts, "cancelled",
                                                       None, refusal):
                        raise Fenced()
                    return OperationResult(status="cancelled", reason=refusal)
            elif row["status"] == "awaiting_approval":
                raise ApplicationError("follow-up not approved", type=ErrorType.PERMANENT.value,
                                       non_retryable=True)
            else:
                remaining = row["lease_remaining"]
                if (remaining is not None and remaining > 0 and owner != attempt_name
                        and not uncertain):
                    # Another holder (a crashed or zombie attempt of another operation on this
                    # intent): come back when its lease expires, not spending attempts.
                    raise Deferred("intent_lease_held", float(remaining) + 0.5)
                # The words before the lease: a follow-up that may not go out as configured
                # (no opt-out link possible, a template gone) is blocked without one.
                followup = await self._compose(conn, row)
                # Recorded before the call: a reply to it is known whatever happens next.
                await intents.record_message_id(conn, intent_id=intent_id,
                                                message_id=followup.headers["Message-ID"])
                await intents.take_lease(
                    conn, intent_id=intent_id, lease_owner=attempt_name, lease_seconds=lease,
                    tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                    audit_detail={"intent_id": intent_id, "eligible": True, "reason": None,
                                  "previous_attempt_unconfirmed": uncertain,
                                  "consent": consent_detail})
        if held is not None:
            raise ApplicationError("previous send unconfirmed and the intent is no longer "
                                   "eligible", type=ErrorType.AMBIGUOUS.value,
                                   non_retryable=True)
        if uncertain:
            self._uncertain.add(attempt_name)
        sent = await mail.send(
            intent_id,
            OutgoingEmail(to=followup.to, subject=followup.subject, text=followup.text,
                          html=followup.html, headers=followup.headers,
                          sender=followup.sender, reply_to=followup.reply_to,
                          deliver_by=deliver_by),
        )
        self._uncertain.discard(attempt_name)
        return sent.message_id

    async def _crm_consent(self, tenant: str, intent_id: str) -> ConsentView:
        """The CRM record's opt-out (`CrmConsent`), or `inboxcrm_only` where the CRM has no
        such field or the contact has no CRM record; skipped for an intent that is no longer
        going to be sent (sent or cancelled: the check below answers from the store)."""
        async with self._pool.acquire() as conn:
            facts = await consent_store.intent_crm_record(conn, intent_id=intent_id)
        if (facts is None or facts["status"] in ("sent", "cancelled")
                or facts["crm_record_id"] is None):
            # No CRM record to read: no CRM client is built (a worker without CRM
            # settings still sends; the opt-out recorded here still applies).
            return INBOXCRM_ONLY
        try:
            crm = self._destinations.crm(tenant)
        except ConfigurationError as exc:
            activity.logger.error("crm destination unusable for the consent check: %s", exc)
            raise ApplicationError("permanent: destination_config",
                                   type=ErrorType.PERMANENT.value, non_retryable=True) from None
        return await self._crm_opt_out.read(tenant, crm, facts["crm_record_id"])

    async def _compose(self, conn: Conn, row: asyncpg.Record) -> Followup:
        return await compose_intent(conn, row, self._settings)

    def _record(self, attempt: Attempt, message_id: str, reconciled: bool,
                mail: MailClient) -> Recorded:
        """The intent becomes `sent` (`AlsoRecord.INTENT_SENT`) with this entry."""
        return Recorded(
            # A deliberate second send is audited as such (docs/architecture.md §6).
            actor="send",
            action="followup_sent_again" if is_again_key(attempt.op.op_key) else "followup_sent",
            detail={"op_key": attempt.op.op_key, "intent_id": _intent_id(attempt),
                    "idempotency_key": _intent_id(attempt), "provider": mail.name,
                    "provider_message_id": message_id, "attempt": attempt.claim.attempts,
                    "reconciled": reconciled},
        )


async def compose_intent(conn: Conn, row: asyncpg.Record, settings: Settings,
                         for_log: bool = False) -> Followup:
    """The follow-up of this intent (`intents.claim_intent`'s row): the planned words, the
    tenant's sender, the message's language, its thread. Deterministic, so the CRM's log of
    the sent follow-up shows the words that went out. A refusal is permanent (the
    operation is blocked with it)."""
    try:
        policy = get_policy(row["tenant"])
        template = await _planned_template(conn, row, policy)
        head = atrest.open_head(row["head"], tenant=str(row["tenant"]),
                                event_id=str(row["head_event_id"]))
        sender = policy.sender.from_address or settings.mail_from
        thread = Thread(followup_message_id(str(row["intent_id"]), sender),
                        row["inbound_message_id"], tuple(row["thread_refs"] or ()))
        followup = compose(policy, template, to=row["email"], contact_id=row["contact_id"],
                           name=row["name"], company=row["company"],
                           languages=reply_languages(row["languages"], head),
                           settings=settings, thread=thread, for_log=for_log)
        return _with_approved_draft(followup, row, settings)
    except FollowupRefused as refused:
        activity.logger.error("follow-up refused: %s", refused)
        reason = refused.reason
    except (UnknownTenant, PolicyError, TemplateRefused) as exc:
        activity.logger.error("follow-up template unusable: %s", exc)
        reason = "template_unusable"
    raise AdapterError(Classified(Category.PERMANENT, reason))


def _with_approved_draft(followup: Followup, row: asyncpg.Record, settings: Settings
                         ) -> Followup:
    """The follow-up in the words a reviewer edited and approved (docs/architecture.md §6,
    "Edited drafts"): the stored draft replaces the rendered plain text, and the HTML part
    is dropped (it shows the rendered words); nothing else changes (sender, subject,
    headers, the intent's idempotency key). The stored text must be the approved hash and
    within the rule's limits still, else nothing is sent (`FollowupRefused`)."""
    approved = row["approved_draft_sha256"]
    if approved is None:
        return followup
    text = intents.opened_draft(row, tenant=str(row["tenant"]))  # sealed at rest
    if text is None or row["draft_sha256"] != approved or draft_sha256(text) != approved:
        raise FollowupRefused("draft_changed", "the stored draft is not the approved one")
    checked = drafts.check(text, drafts.terms_of(row["tenant"], row["rule_id"],
                                                      row["contact_id"], settings))
    if checked.refused is not None:
        raise FollowupRefused(checked.refused.replace(":", "_"),
                              "the approved draft is outside its draft limits")
    return dataclasses.replace(followup, text=text, html=None)


# Stored template versions, validated once per worker: a version is named by the hash of its
# words (`<name>@<version>`), so what is stored under a reference never changes.
_STORED: dict[tuple[str, str], Template] = {}
_STORED_MAX = 512


async def _planned_template(conn: Conn, row: asyncpg.Record, policy: TenantPolicy
                            ) -> Template:
    """The template version the plan stored (`<name>@<version>`). An intent planned before
    templates were versioned names a bare template: the rule's current template."""
    ref = str(row["template_id"])
    if "@" in ref:
        key = (str(row["tenant"]), ref)
        if key in _STORED:
            return _STORED[key]
        sources = await template_store.stored_version(conn, row["tenant"], ref)
        if sources is None:
            raise TemplateRefused(f"template version {ref} is not stored")
        template = from_sources(sources)
        if len(_STORED) >= _STORED_MAX:
            _STORED.clear()
        _STORED[key] = template
        return template
    rule = policy.rule_by_id(row["rule_id"])
    if rule is None:
        raise TemplateRefused(f"rule {row['rule_id']!r} is no longer in the policy")
    return policy.template_for(rule)


CRM_OPT_OUT = "crm_opt_out"


def _ineligible(row: asyncpg.Record, purpose: str = "service",
                consent: ConsentView = INBOXCRM_ONLY) -> str | None:
    """Why this intent may not be sent now, or None. A suppression of scope `marketing`
    stops only a marketing rule's follow-up; the CRM's opt-out field stops any."""
    if row["status"] == "cancelled":
        return "intent_cancelled"
    if row["suppressed"] and (row["suppression_scope"] != "marketing"
                              or purpose == "marketing"):
        return "suppressed"
    if row["contact_status"] != "active":
        return f"contact_{row['contact_status']}"
    if consent.opted_out:
        return CRM_OPT_OUT
    return None


def _consent_record(row: asyncpg.Record) -> dict[str, str]:
    """The consent record of this send: its rule's purpose and lawful basis (the tenant's
    policy; a rule no longer in it is recorded as the default service reply)."""
    try:
        rule = get_policy(row["tenant"]).rule_by_id(row["rule_id"])
    except (UnknownTenant, PolicyError):
        rule = None
    if rule is None:
        return {"purpose": "service", "lawful_basis": "reply_to_inquiry"}
    return {"purpose": rule.purpose, "lawful_basis": rule.lawful_basis}


def _lease_seconds() -> float:
    """The send lease: what is left of this step, less the time to record the result. The
    step (start-to-close) covers claim, reconcile and call; the lease covers the delivery and
    ends before the step does, so a re-run (after the step's timeout) never meets a live
    lease of a delivery that may still hand the message over."""
    info = activity.info()
    timeout = info.start_to_close_timeout
    if not timeout:
        return LEASE_SECONDS
    elapsed = max((datetime.now(UTC) - info.started_time).total_seconds(), 0.0)
    return timeout.total_seconds() - elapsed - RECORD_MARGIN_SECONDS


def _lease_owner(attempt: Attempt) -> str:
    """The attempt, as the intent's lease names it: operation key and claim token."""
    return f"{attempt.op.op_key}#{attempt.claim.attempts}"


def _intent_id(attempt: Attempt) -> str:
    ref = attempt.claim.external_ref
    if ref is None:
        raise missing_row("intent_reference")
    return ref
